"""Readmission checks (spec §6.3–6.5) against a mocked fleet."""

from __future__ import annotations

from typing import Any

import pytest

from router.attestation import contract_fingerprint
from router.engines.control import EngineControl
from router.lifecycle.machine import LifecycleMachine
from router.lifecycle.pairs import PairError, recovery_pairs, validation_pairs
from router.lifecycle.readmission import Readmission
from router.scheduler import Scheduler

from .fake_engines import FakeFleet
from .helpers import CONTRACT, fleet, machine

FP = f"attestation {contract_fingerprint(CONTRACT)}"


def setup(n: int = 3, contract: bool = True, policy: str = "individual") -> tuple[Any, ...]:
    m, sched, _clock = machine(n=n, policy=policy, contract=contract)
    fake = FakeFleet(n)
    control = EngineControl(m.config, transport=fake.transport())
    m.process_starts = {iid: e.start for iid, e in fake.engines.items()}
    return m, sched, fake, Readmission(m.config, sched, m, control)


async def drain_and_validate(m: LifecycleMachine, r: Readmission, iid: str = "e0") -> Any:
    m.begin([iid], False, 300)
    for k, v in (await r.capture([iid])).items():
        m.bind_capture(k, v)
    targets = m.mark_validating([iid], False)
    return (await r.validate(targets, False))[iid]


async def test_planned_restart_passes_with_all_labels() -> None:
    m, sched, fake, r = setup()
    m.begin(["e0"], False, 300)
    assert await r.capture(["e0"]) == {"e0": 1000.0}
    m.bind_capture("e0", 1000.0)
    fake.engines["e0"].restart()
    m.mark_validating(["e0"], False)
    v = (await r.validate(["e0"], False))["e0"]
    assert v.errors == []
    assert v.checks == [
        "health", FP, "model", "new process identity", "generation",
        "fabric produce to e1", "fabric consume from e1", "final health",
    ]  # fmt: skip
    assert v.process_start == 1100.0
    assert m.complete_validation({"e0": v}) and sched.accepts_new("e0")


async def test_not_restarted_fails_before_generation() -> None:
    m, _, _, r = setup()
    v = await drain_and_validate(m, r)
    assert v.errors == ["engine process did not restart after drain"]
    assert v.checks == ["health", FP, "model"]


@pytest.mark.parametrize(
    ("fault", "value", "error"),
    [
        ("model", "other", "serves ['other'], expected fake"),
        ("attestation", "broken", "attestation: attestation_digest does not match the document"),
        ("attestation", "fail", "attestation unreadable: EngineAnswerError: attestation answered HTTP 503"),
        ("generation_ok", False, "generation failed: EngineAnswerError: generation answered no choices"),
        ("healthy", False, "health did not answer 200"),
        ("descriptor_ok", False, "fabric e0->e1: EngineAnswerError: prefill leg answered no KV descriptor"),
        ("decode_tokens", 0, "fabric e1->e0: EngineAnswerError: decode leg produced no tokens"),
    ],
)
async def test_gate_failures(fault: str, value: Any, error: str) -> None:
    m, sched, fake, r = setup()
    m.begin(["e0"], False, 300)
    m.bind_capture("e0", 1000.0)
    fake.engines["e0"].restart()
    setattr(fake.engines["e0"], fault, value)
    m.mark_validating(["e0"], False)
    v = (await r.validate(["e0"], False))["e0"]
    assert v.errors == [error]
    assert not m.complete_validation({"e0": v})
    assert m.records["e0"].state == "blocked" and "e0" in sched.draining


async def test_changed_peer_is_ejected() -> None:
    m, sched, fake, r = setup()
    m.begin(["e0"], False, 300)
    m.bind_capture("e0", 1000.0)
    fake.engines["e0"].restart()
    fake.engines["e1"].restart()  # behind the router's back
    m.mark_validating(["e0"], False)
    v = (await r.validate(["e0"], False))["e0"]
    assert "peer process changed before readmission" in v.errors
    assert sched.ejected.get("e1") == "process_identity"
    assert m.events[-1]["action"] == "process_excluded"


async def test_without_contract_attestation_not_configured_but_works() -> None:
    m, _, fake, r = setup(contract=False)
    m.begin(["e0"], False, 300)
    m.bind_capture("e0", (await r.capture(["e0"]))["e0"])
    fake.engines["e0"].restart()
    m.mark_validating(["e0"], False)
    v = (await r.validate(["e0"], False))["e0"]
    assert v.ok and v.checks[1] == "attestation not configured"
    assert not any(c.endswith("/att") for c in fake.engines["e0"].calls)


async def test_capture_reports_exception_type() -> None:
    _m, _, fake, r = setup()
    fake.engines["e2"].metrics_ok = False
    fake.engines["e1"].reachable = False
    got = await r.capture(["e0", "e1", "e2"])
    assert got == {
        "e0": 1000.0,
        "e1": "process identity unreadable: ConnectError",
        "e2": "process identity unreadable: ConnectError",
    }


async def test_wave_ring_labels() -> None:
    m, _, fake, r = setup()
    m.begin([], True, 300)
    for iid, res in (await r.capture(m.engine_ids)).items():
        m.bind_capture(iid, res)
    for e in fake.engines.values():
        e.restart()
    targets = m.mark_validating([], True)
    verdicts = await r.validate(targets, True)
    assert verdicts["e0"].checks[-3:] == ["fabric produce to e1", "fabric consume from e2", "final health"]
    assert verdicts["e1"].checks[-3:] == ["fabric consume from e0", "fabric produce to e2", "final health"]
    assert verdicts["e2"].checks[-3:] == ["fabric consume from e1", "fabric produce to e0", "final health"]
    assert m.complete_validation(verdicts)


async def test_identity_change_during_fabric_fails_and_resets_wave() -> None:
    m, sched, fake, r = setup(policy="whole_wave")
    m.begin([], True, 300)
    for iid, res in (await r.capture(m.engine_ids)).items():
        m.bind_capture(iid, res)
    for e in fake.engines.values():
        e.restart()
    targets = m.mark_validating([], True)
    wave = m.wave_id
    original = fake.handle

    def flaky(request: Any) -> Any:
        if request.url.path == "/v1/completions" and b"do_remote_decode" in request.content:
            fake.engines["e2"].start += 1  # e2 restarts mid-validation
        return original(request)

    fake.handle = flaky  # type: ignore[method-assign]
    r.control._client = None
    r.control._transport = fake.transport()
    verdicts = await r.validate(targets, True)
    assert any(
        "identity changed or unavailable during validation" in e for v in verdicts.values() for e in v.errors
    )
    assert sched.ejected.get("e2") == "process_identity"
    assert m.wave_id != wave  # restart wave reset
    assert not m.complete_validation(verdicts)


async def test_whole_wave_precheck_refuses_single() -> None:
    _m, _, _, r = setup(policy="whole_wave")
    v = await r.validate(["e0"], False)
    assert v["e0"].errors == ["engine_restart_policy requires whole-wave readmission"]


def test_pairs() -> None:
    cfg = fleet(3)
    sched = Scheduler.from_specs(cfg.engines)
    e = sched.engines
    assert validation_pairs(list(e.values())) == [("e0", "e1"), ("e1", "e2"), ("e2", "e0")]
    assert recovery_pairs(e["e1"], [e["e0"], e["e2"]]) == [("e1", "e0"), ("e0", "e1")]
    with pytest.raises(PairError, match="requires an eligible peer"):
        recovery_pairs(e["e0"], [])
    e["e0"].pin, e["e0"].role = True, "prefill"
    e["e1"].pin, e["e1"].role = True, "prefill"
    with pytest.raises(PairError, match="e0 has no eligible fabric consumer peer"):
        recovery_pairs(e["e0"], [e["e1"]])
    assert recovery_pairs(e["e0"], [e["e1"], e["e2"]]) == [("e0", "e2")]
