"""Shared router core: placement state, counters, control state and readiness predicates."""

from __future__ import annotations

from dataclasses import dataclass

from router.clock import FakeClock
from router.config import parse_fleet
from router.core import RouterCore
from router.counters import Counters
from router.ha.control import ControlState
from router.journal import Journal
from router.scheduler import Scheduler


def _fleet(**extra: object) -> dict[str, object]:
    return {
        "schema": "narwhal.fleet",
        "schema_version": 2,
        "model": "m",
        "engines": [
            {"iid": "e0", "url": "http://127.0.0.1:1", "role": "prefill"},
            {"iid": "e1", "url": "http://127.0.0.1:2", "role": "decode"},
            {"iid": "e2", "url": "http://127.0.0.1:3", "role": "decode", "pin": True},
        ],
        **extra,
    }


def _scheduler() -> Scheduler:
    return Scheduler.from_specs(parse_fleet(_fleet()).engines)


def test_pick_prefers_role_then_least_resident() -> None:
    s = _scheduler()
    assert s.pick("decode") is not None
    s.engines["e1"].resident_decode = 3
    picked = s.pick("decode")
    assert picked is not None and picked.iid == "e2"
    prefill = s.pick("prefill")
    assert prefill is not None and prefill.iid == "e0"


def test_pinned_engine_never_serves_the_other_role() -> None:
    s = _scheduler()
    s.draining.update({"e0", "e1"})
    assert s.pick("prefill") is None  # e2 is pinned to decode
    picked = s.pick("decode")
    assert picked is not None and picked.iid == "e2"


def test_unpinned_engine_takes_the_other_leg_when_its_role_is_empty() -> None:
    s = _scheduler()
    s.draining.add("e0")
    picked = s.pick("prefill")
    assert picked is not None and picked.iid == "e1"


def test_ejected_draining_and_fleet_hold_remove_engines_from_placement() -> None:
    s = _scheduler()
    events: list[tuple[str, str]] = []
    s.on_eject.append(lambda iid, cause: events.append((iid, cause)))
    assert s.eject("e1", "connection") is True
    assert s.eject("e1", "connection") is False
    assert events == [("e1", "connection")]
    assert not s.accepts_new("e1")
    s.draining.add("e2")
    assert [e.iid for e in s.eligible()] == ["e0"]
    s.fleet_hold = "whole-wave drain wave-1"
    assert s.eligible() == [] and s.pick("prefill") is None
    assert s.uneject("e1") and not s.uneject("e1")


def test_counters_identity_and_reason_restore() -> None:
    c = Counters()
    for _ in range(4):
        c.offer()
    c.finish("served")
    c.finish("failed", "engine_timeout")
    c.finish("rejected", "not_ready")
    c.finish("invalid_requests", "invalid_json")
    assert c.values["offered"] == c.terminal_total() == 4
    assert c.outcome_reasons()["failed"] == {"engine_timeout": 1}
    restored = Counters()
    restored.restore({"served": 7, "failed": 3}, {"failed": {"engine_error": 1}})
    assert restored.values["served"] == 7
    assert restored.outcome_reasons()["failed"] == {"engine_error": 1, "unclassified": 2}


@dataclass
class _Lease:
    epoch: int
    holder: str
    ok: bool

    def valid(self) -> bool:
        return self.ok


def test_control_state_predicates() -> None:
    assert ControlState().controls_fleet()
    lease = _Lease(3, "a:1", True)
    control = ControlState(lease)
    assert control.controls_fleet() and control.epoch == 3 and control.holder == "a:1"
    lease.ok = False
    assert not control.controls_fleet() and control.fenced() and control.epoch == 0
    assert control.not_controlling_reason() == "lease expired"
    standby = ControlState(_Lease(1, "b:2", False), standby=True)
    assert not standby.fenced() and standby.not_controlling_reason() == "shadowing"


def test_ready_reason_precedence_and_health_status() -> None:
    core = RouterCore(parse_fleet(_fleet()), Journal(None), clock=FakeClock())
    assert core.ready() and core.ready_reason() == "" and core.health_status() == "ok"
    core.identities_ready = False
    assert core.ready_reason() == "engine identity validation pending"
    core.scheduler.fleet_hold = "whole-wave drain wave-abc"
    assert core.ready_reason() == "whole-wave drain wave-abc"
    assert core.health_status() == "maintenance"
    core.control.failover_blocked = "lease renewal failed"
    assert core.ready_reason() == "lease renewal failed"
    assert core.health_status() == "fenced"
    assert core.prefill_hold_reason() == "lease renewal failed"


def test_standby_router_is_not_ready_and_holds_prefill() -> None:
    core = RouterCore(parse_fleet(_fleet()), Journal(None), control=ControlState(standby=True))
    assert not core.ready()
    assert core.ready_reason() == "shadowing"
    assert core.health_status() == "standby"
    assert core.prefill_hold_reason() == "standby: the primary router is serving"


def test_equal_load_engines_share_light_traffic() -> None:
    s = _scheduler()
    picks = set()
    for _ in range(4):
        e = s.pick("decode")
        assert e is not None
        picks.add(e.iid)
    assert picks == {"e1", "e2"}


def test_ties_rotate_per_role_whatever_the_other_role_picked() -> None:
    """2 prefill + 2 decode engines, sequential requests (prefill pick, then decode pick): both roles
    split evenly. Before the fix one shared scan offset made every decode pick land on the same engine."""
    fleet = _fleet()
    fleet["engines"] = [
        {"iid": f"e{i}", "url": f"http://127.0.0.1:{i + 1}", "role": "prefill" if i < 2 else "decode"}
        for i in range(4)
    ]
    s = Scheduler.from_specs(parse_fleet(fleet).engines)
    counts: dict[str, int] = {}
    for _ in range(20):
        for phase in ("prefill", "decode"):
            e = s.pick(phase)  # type: ignore[arg-type]
            assert e is not None and e.role == phase
            counts[e.iid] = counts.get(e.iid, 0) + 1
    assert counts == {"e0": 10, "e1": 10, "e2": 10, "e3": 10}
    s.engines["e3"].resident_decode = 1  # load still wins over rotation
    assert [s.pick("decode").iid for _ in range(3)] == ["e2", "e2", "e2"]  # type: ignore[union-attr]
