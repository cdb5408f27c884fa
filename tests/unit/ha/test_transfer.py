"""build / apply (spec §2.4–2.5): what is restored, the verbatim refusals, and no partial application."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.clock import FakeClock
from router.counters import HANDOFF_COUNTERS, REASON_OUTCOMES
from router.ha.demand_risk import RISK_KINDS
from router.ha.handoff import Handoff, validate
from router.lifecycle.models import LIFECYCLE_STATES
from tests.unit.ha.helpers import core, fixture, fleet, handover, machine

IDS = ["e0", "e1", "e2"]


def _state(c: Any) -> tuple[Any, ...]:
    s = c.scheduler
    return (
        s.roles(),
        dict(s.ejected),
        set(s.draining),
        s.fleet_hold,
        {k: set(v) for k, v in s.inference_suspects.items()},
        c.counters.snapshot(),
        c.counters.outcome_reasons(),
        machine(c).snapshot().model_dump() if c.lifecycle is not None else None,
        c.demand_risk.snapshot(),
    )


def _doc(**over: Any) -> Handoff:
    raw = fixture("handoff_after_resume.json")
    raw.update(over)
    return validate(raw)


def test_apply_restores_roles_counters_ejections_suspects_and_holds() -> None:
    c = core(fleet(pinned=("e1",)))
    raw = fixture("handoff_after_resume.json")  # e0 decode, e1 prefill, e2 drained, served 20
    raw["ejected"] = ["e1"]
    raw["inference_sources"] = {"e0": ["", "e1"]}
    ok, why = handover(c).apply(validate(raw))
    assert ok, why
    assert why.startswith("handoff applied: gap ") and "3 roles, 1 ejected; counters served=20" in why
    roles = c.scheduler.roles()
    assert roles["e0"] == "decode" and roles["e1"] == "decode"  # e1 is pinned: config owns its role
    assert c.counters.values["served"] == 20 and c.counters.values["offered"] == 22
    assert c.counters.outcome_reasons()["rejected"] == {"not_ready": 1}
    assert c.scheduler.ejected["e1"] == "handoff"
    assert c.scheduler.inference_suspects == {"e0": {"", "e1"}}
    assert "e2" in c.scheduler.draining  # the drained engine stays out of placement
    rec = machine(c).records["e2"]
    assert rec.state == "drained" and rec.old_process_start == 1795966496.195119
    assert machine(c).process_starts["e0"] == 1795966496.1706276


def test_covered_suspect_is_ejected_and_probe_is_due_at_once() -> None:
    c = core()
    ok, _ = handover(c).apply(_doc(inference_sources={"e1": ["e0"]}))
    assert ok
    assert c.scheduler.ejected.get("e1") == "inference_probe"  # e2 still covers decode


def test_outcome_reason_shortfall_is_unclassified() -> None:
    c = core()
    counters = dict.fromkeys(HANDOFF_COUNTERS, 0) | {"failed": 5}
    ok, _ = handover(c).apply(_doc(counters=counters, outcome_reasons={"failed": {"engine_timeout": 2}}))
    assert ok
    assert c.counters.outcome_reasons()["failed"] == {"engine_timeout": 2, "unclassified": 3}


def test_validating_record_is_restored_blocked() -> None:
    c = core()
    raw = fixture("handoff_after_resume.json")
    raw["lifecycle"]["records"][2]["state"] = "validating"
    ok, _ = handover(c).apply(validate(raw))
    assert ok
    rec = machine(c).records["e2"]
    assert (
        rec.state == "blocked" and rec.error == "readmission validation was interrupted by router replacement"
    )


def test_demand_risk_is_reanchored_and_counts_added() -> None:
    c = core(clock=FakeClock(monotonic=50_000.0))
    c.demand_risk.record("first_token_timeout")
    c.clock.advance(1.0)  # type: ignore[attr-defined]
    ok, _ = handover(c).apply(_doc())  # p_to_d_recovery, age 117.73 s, 1 event
    assert ok
    snap = c.demand_risk.snapshot()
    assert snap is not None
    assert snap.kind == "first_token_timeout"  # ours (1 s old) is the latest
    assert snap.events == {"first_token_timeout": 1, "p_to_d_recovery": 1}
    fresh = core()
    assert handover(fresh).apply(_doc())[0]
    risk = fresh.demand_risk.snapshot()
    assert risk is not None and risk.kind == "p_to_d_recovery" and abs(risk.age_s - 117.73437819499998) < 1e-6


def _refused(c: Any, doc: Handoff | None) -> str:
    before = copy.deepcopy(_state(c))
    ok, why = handover(c).apply(doc)
    assert not ok
    assert _state(c) == before, "a refused handoff must leave the router untouched"
    return why


def _busy_core(**kw: Any) -> Any:
    c = core(fleet(**kw))
    c.counters.finish("served")
    c.counters.finish("failed", "engine_timeout")
    c.scheduler.engines["e1"].role = "prefill"
    return c


def test_refusal_reasons_are_verbatim_and_nothing_is_applied() -> None:
    assert _refused(_busy_core(), None) == "no handoff file"
    assert (
        _refused(_busy_core(n=4), _doc())
        == "handoff names ['e0', 'e1', 'e2'], this fleet is ['e0', 'e1', 'e2', 'e3']"
    )
    assert _refused(_busy_core(policy="whole_wave"), _doc()) == "handoff engine restart policy mismatch"
    raw = fixture("handoff_initial.json")
    del raw["lifecycle"]["process_starts"]["e1"]
    assert (
        _refused(_busy_core(contract=True), validate(raw))
        == "handoff lacks an available engine's process identity"
    )


def test_contracted_identity_gap_is_excused_for_ejected_or_held_engines() -> None:
    raw = fixture("handoff_initial.json")
    del raw["lifecycle"]["process_starts"]["e1"]
    raw["ejected"] = ["e1"]
    assert handover(core(fleet(contract=True))).apply(validate(raw))[0]


def test_incoherent_lifecycle_is_refused_before_anything_changes() -> None:
    raw = fixture("handoff_after_resume.json")
    raw["lifecycle"]["records"][2]["wave_id"] = "wave-000000000001"  # orphan wave ID
    raw["counters"]["served"] = 999
    why = _refused(_busy_core(), validate(raw))
    assert why.startswith("handoff lifecycle rejected:")


def test_foreign_model_is_refused() -> None:
    assert _refused(_busy_core(), _doc(model="other-model")).startswith("handoff model 'other-model'")


def test_without_a_lifecycle_object_holds_still_survive() -> None:
    c = core(lifecycle=False)
    assert handover(c).apply(_doc())[0]
    assert c.scheduler.draining == {"e2"}


# -- property: build → validate → apply → build round-trips ----------------------------------------

_STABLE = [s for s in LIFECYCLE_STATES if s not in ("draining", "deadline_exceeded")]
_times = st.floats(min_value=1.6e9, max_value=2.0e9, allow_nan=False)


@st.composite
def _records(draw: st.DrawFn) -> dict[str, Any]:
    wave = draw(st.booleans())
    wave_id = "wave-abcdefabcdef" if wave else ""
    iids = IDS if wave else sorted(draw(st.sets(st.sampled_from(IDS))))
    records = []
    for iid in iids:
        state = draw(st.sampled_from([*_STABLE, "draining"]))
        old = draw(st.none() | _times)
        if state == "draining":
            old = None  # a draining engine with no identity stays draining (refresh would finish it)
        records.append(
            {
                "iid": iid,
                "state": state,
                "requested_at": draw(_times),
                "deadline_at": draw(_times),
                "restart_required": draw(st.booleans()),
                "wave_id": wave_id,
                "old_process_start": old,
                "new_process_start": draw(st.none() | _times),
                "error": draw(st.sampled_from(["", "boom"])),
                "checks": draw(st.lists(st.sampled_from(["health", "model", "generation"]), max_size=3)),
            }
        )
    starts = draw(st.dictionaries(st.sampled_from(IDS), _times))
    return {"wave_id": wave_id, "records": records, "events": [], "engine_restart_policy": "individual",
            "process_starts": starts}  # fmt: skip


@st.composite
def _handoffs(draw: st.DrawFn) -> dict[str, Any]:
    counters = {k: draw(st.integers(0, 10_000)) for k in HANDOFF_COUNTERS}
    reasons = {
        o: draw(st.dictionaries(st.sampled_from(["a", "b"]), st.integers(1, 5))) for o in REASON_OUTCOMES
    }
    risk = draw(
        st.none()
        | st.fixed_dictionaries(
            {
                "kind": st.sampled_from(RISK_KINDS),
                "age_s": st.floats(0, 1e5, allow_nan=False),
                "events": st.dictionaries(st.sampled_from(RISK_KINDS), st.integers(1, 9)),
            }
        )
    )
    return {
        "schema": "narwhal.handoff",
        "schema_version": 1,
        "at": draw(_times),
        "run": "1795966346-11c701c9",
        "model": "fake",
        "epoch": draw(st.integers(0, 99)),
        "holder": "",
        "engines": IDS,
        "roles": {i: draw(st.sampled_from(["prefill", "decode"])) for i in IDS},
        "ejected": sorted(draw(st.sets(st.sampled_from(IDS)))),
        "inference_sources": {},
        "counters": counters,
        "outcome_reasons": reasons,
        "lifecycle": draw(_records()),
        "demand_risk": risk,
    }


def _comparable(doc: Handoff) -> dict[str, Any]:
    d = doc.dump()
    for key in ("at", "run", "epoch", "holder"):
        d.pop(key)
    return d


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_handoffs())
def test_build_validate_apply_build_round_trips(raw: dict[str, Any]) -> None:
    original = validate(raw)
    first = core()
    ok, why = handover(first).apply(original)
    assert ok, why
    built = handover(first).build()
    # what the receiver publishes is what it was given (validating records come back blocked)
    assert built.roles == original.roles and built.ejected == original.ejected
    assert built.counters == original.counters
    for outcome in REASON_OUTCOMES:
        restored = dict(built.outcome_reasons[outcome])
        shortfall = restored.pop("unclassified", 0)
        assert restored == original.outcome_reasons[outcome]
        assert shortfall == max(
            0, original.counters[outcome] - sum(original.outcome_reasons[outcome].values())
        )
    states = {r.iid: r.state for r in built.lifecycle.records}
    assert states == {
        r.iid: ("blocked" if r.state == "validating" else r.state) for r in original.lifecycle.records
    }
    assert built.lifecycle.process_starts == original.lifecycle.process_starts
    assert (built.demand_risk is None) == (original.demand_risk is None)
    if built.demand_risk is not None and original.demand_risk is not None:
        assert abs(built.demand_risk.age_s - original.demand_risk.age_s) < 1e-6
        assert built.demand_risk.events == {k: n for k, n in sorted(original.demand_risk.events.items())}
    # and a second hop changes nothing at all
    second = core()
    assert handover(second).apply(validate(built.dump()))[0]
    assert _comparable(handover(second).build()) == _comparable(built)
