"""Breaker decisions (pure, FakeClock): streaks, ejection cap, probes, readmission, journal events."""

from __future__ import annotations

from typing import Any

from router.breaker import Breaker
from router.clock import FakeClock
from router.config import EngineSpec
from router.scheduler import Scheduler


def make(
    n: int = 3, pins: dict[str, str] | None = None
) -> tuple[Breaker, Scheduler, list[dict[str, Any]], FakeClock]:
    specs = []
    for i in range(n):
        iid = f"e{i}"
        role = (pins or {}).get(iid, "prefill" if i == 0 else "decode")
        specs.append(EngineSpec(iid=iid, url=f"http://x{i}", role=role, pin=iid in (pins or {})))
    sched = Scheduler.from_specs(specs)
    events: list[dict[str, Any]] = []
    clock = FakeClock()
    return Breaker(sched, clock, eject_after=3, emit=events.append), sched, events, clock


def test_connection_streak_ejects_at_threshold() -> None:
    b, sched, events, clock = make()
    assert b.record_failure("e1", "connection").action == "none"
    assert b.record_failure("e1", "connection").action == "none"
    d = b.record_failure("e1", "connection")
    assert (d.action, d.cause) == ("eject", "connection")
    assert sched.ejected == {"e1": "connection"}
    assert events[-1] == {
        "event": "engine_ejected",
        "at": clock.wall(),  # wall time (UTC seconds), like every event
        "iid": "e1",
        "cause": "connection",
    }
    assert b.ejections[("e1", "connection")] == 1


def test_success_evidence_clears_the_streak() -> None:
    b, sched, _, _ = make()
    b.record_failure("e1", "connection")
    b.record_failure("e1", "connection")
    b.record_success("e1", "decode")
    assert b.record_failure("e1", "connection").action == "none"
    assert not sched.ejected


def test_transport_evidence_clears_connection_but_not_timeout() -> None:
    b, _, _, _ = make()
    for _ in range(2):
        b.record_failure("e1", "connection")
        b.record_failure("e1", "timeout")
    b.record_success("e1", "transport")
    assert b.record_failure("e1", "connection").action == "none"
    assert b.record_failure("e1", "timeout").action == "probe_health"


def test_classes_count_separately() -> None:
    b, sched, _, _ = make()
    for cls in ("connection", "timeout", "overload", "connection", "timeout"):
        assert b.record_failure("e1", cls).action == "none"
    assert not sched.ejected


def test_timeout_and_overload_ask_for_a_health_probe() -> None:
    b, sched, _, _ = make()
    for cls in ("timeout", "overload"):
        for _ in range(2):
            b.record_failure("e2", cls)
        d = b.record_failure("e2", cls)
        assert (d.action, d.iid, d.cause) == ("probe_health", "e2", cls)
    assert not sched.ejected
    assert b.health_result("e2", None).action == "none"  # inconclusive keeps things as they are
    assert b.health_result("e2", True).action == "none"
    assert not sched.ejected
    d = b.health_result("e2", False)
    assert (d.action, d.cause) == ("eject", "health_probe")
    assert sched.ejected == {"e2": "health_probe"}


def test_no_second_probe_while_one_is_running() -> None:
    b, _, _, _ = make()
    b.probing.add("e2")
    for _ in range(3):
        d = b.record_failure("e2", "timeout")
    assert d.action == "none"


def test_inference_classes_make_a_held_suspect_and_ask_for_an_inference_probe() -> None:
    b, sched, events, _ = make()
    for _ in range(2):
        b.record_failure("e1", "stream", producer="e0")
    d = b.record_failure("e1", "stream", producer="e0")
    assert (d.action, d.cause) == ("probe_inference", "stream")
    assert sched.inference_suspects == {"e1": {"e0"}}
    assert "e1" in sched.held and not sched.accepts_new("e1")
    assert events[-1]["event"] == "engine_hold_started"
    assert b.inference_result("e1", True).action == "none"
    assert sched.inference_suspects == {} and sched.held == {}


def test_failed_inference_probe_ejects() -> None:
    b, sched, _, _ = make()
    for _ in range(3):
        d = b.record_failure("e2", "kv_handoff")
    assert d.action == "probe_inference"
    assert sched.inference_suspects == {"e2": {""}}
    d = b.inference_result("e2", False)
    assert (d.action, d.cause) == ("eject", "inference_probe")
    assert "e2" not in sched.held


def test_last_engine_of_a_role_is_spared() -> None:
    b, sched, events, _ = make(2, pins={"e0": "prefill", "e1": "decode"})
    for _ in range(3):
        d = b.record_failure("e1", "connection")
    assert (d.action, d.cause) == ("spared", "connection")
    assert not sched.ejected
    assert events[-1]["event"] == "engine_ejection_spared"
    assert b.spared[("e1", "connection")] == 1


def test_unpinned_fleet_keeps_exactly_one_engine() -> None:
    b, sched, _, _ = make(3)
    outcomes = []
    for iid in ("e0", "e1", "e2"):
        for _ in range(3):
            d = b.record_failure(iid, "connection")
        outcomes.append(d.action)
    assert outcomes == ["eject", "eject", "spared"]
    assert sorted(sched.ejected) == ["e0", "e1"]
    assert [e.iid for e in sched.eligible()] == ["e2"]


def test_suspect_not_held_when_it_alone_covers_its_role() -> None:
    b, sched, _, _ = make(2, pins={"e0": "prefill", "e1": "decode"})
    for _ in range(3):
        d = b.record_failure("e1", "inference_status")
    assert d.action == "probe_inference"
    assert "e1" not in sched.held
    assert b.inference_result("e1", False).action == "spared"


def test_readmission_due_after_interval_and_readmit_event() -> None:
    b, sched, events, clock = make()
    b.eject("e1", "connection")
    assert b.due_for_readmission(3.0) == []
    clock.advance(3.0)
    assert b.due_for_readmission(3.0) == ["e1"]
    assert b.readmission_probe("e1", False) is False
    assert b.due_for_readmission(3.0) == []  # the probe resets the cadence
    clock.advance(3.0)
    assert b.readmission_probe("e1", True, "health") is True
    assert sched.ejected == {}
    assert events[-1] == {
        "event": "engine_readmitted",
        "at": clock.wall(),  # wall time (UTC seconds), like every event
        "iid": "e1",
        "evidence": "health",
    }
    assert b.readmissions["e1"] == 1
    assert b.readmit("e1", "health") is False  # idempotent


def test_ejection_by_someone_else_is_counted_and_journaled() -> None:
    b, sched, events, _ = make()
    sched.eject("e2", "process_identity")
    assert b.ejections[("e2", "process_identity")] == 1
    assert events[-1]["event"] == "engine_ejected" and events[-1]["cause"] == "process_identity"


def test_failures_on_an_ejected_engine_do_nothing_more() -> None:
    b, _sched, _, _ = make()
    b.eject("e1", "liveness")
    for _ in range(5):
        assert b.record_failure("e1", "connection").action == "none"
    assert b.ejections[("e1", "connection")] == 0
