"""The lifecycle state machine (spec §4.2, §5.3, §5.6, §6.1) with a fake clock."""

from __future__ import annotations

import math

import pytest

from router.lifecycle.machine import INTERRUPTED, WAVE_PEER_FAILED, LifecycleError, Verdict

from .helpers import machine


def actions(m: object) -> list[str]:
    return [e["action"] for e in m.events]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("engines", "wave", "deadline", "message"),
    [
        ([], False, 300.0, "a non-wave drain must name exactly one engine"),
        (["e0", "e1"], False, 300.0, "a non-wave drain must name exactly one engine"),
        (["zz", "e0", "aa"], False, 300.0, "unknown engine(s): aa, zz"),
        (["e0"], False, 0.0, "deadline_s must be positive"),
        (["e0"], False, -1.0, "deadline_s must be positive"),
        (["e0"], False, math.nan, "deadline_s must be positive"),
        (["e0"], False, math.inf, "deadline_s must be positive"),
        (["e0", "e1"], True, 300.0, "a whole-wave drain must name every configured engine"),
    ],
)
def test_begin_rejects_unsafe_shapes_without_records(
    engines: list[str], wave: bool, deadline: float, message: str
) -> None:
    m, sched, _ = machine()
    with pytest.raises(LifecycleError) as err:
        m.begin(engines, wave, deadline)
    assert str(err.value) == message
    assert m.records == {} and sched.draining == set() and m.events == type(m.events)()


def test_whole_wave_policy_refuses_single_drain() -> None:
    m, _, _ = machine(policy="whole_wave")
    with pytest.raises(LifecycleError, match="engine_restart_policy requires a whole-wave drain"):
        m.begin(["e0"], False, 10)


def test_drain_then_identity_then_drained_and_duplicates_deduped() -> None:
    m, sched, _ = machine()
    assert m.begin(["e0", "e0"], False, 300) is True
    assert sched.draining == {"e0"} and not sched.accepts_new("e0")
    assert m.state("e0") == "draining" and not m.ready_to_stop("e0")
    m.record_old_identity("e0", 1000.5)
    assert m.state("e0") == "drained" and m.ready_to_stop("e0")
    assert actions(m) == ["drain_started", "process_recorded", "drain_complete"]
    assert m.wave_ready_to_stop()  # peer quirk: individual holds count as the "wave"
    assert not sched.fleet_hold
    with pytest.raises(LifecycleError, match="lifecycle action already active for e0"):
        m.begin(["e0"], False, 300)
    with pytest.raises(LifecycleError, match="lifecycle action already active for e0"):
        m.begin(["e1"], False, 300)


def test_last_schedulable_engine_requires_wave() -> None:
    m, sched, _ = machine(n=2)
    sched.ejected["e1"] = "connection"
    with pytest.raises(LifecycleError, match="the last schedulable engine requires a whole-wave drain"):
        m.begin(["e0"], False, 300)
    m1, _, _ = machine(n=1)
    with pytest.raises(LifecycleError, match="the last schedulable engine"):
        m1.begin(["e0"], False, 300)


def test_deadline_never_cancels_and_error_survives_into_drained() -> None:
    m, sched, clock = machine()
    sched.engines["e0"].resident_decode = 2
    m.begin(["e0"], False, 5)
    m.record_old_identity("e0", 1000.0)
    assert m.state("e0") == "draining"
    clock.advance(4.9)
    m.refresh()
    assert m.state("e0") == "draining"
    clock.advance(0.2)
    m.refresh()
    m.refresh()
    rec = m.records["e0"]
    assert rec.state == "deadline_exceeded"
    assert rec.error == "2 resident request(s) remain after the drain deadline"
    assert actions(m).count("drain_deadline_exceeded") == 1
    assert sched.engines["e0"].resident_decode == 2 and "e0" in sched.draining and not m.ready_to_stop("e0")
    sched.engines["e0"].resident_decode = 0
    m.refresh()
    assert rec.state == "drained" and m.ready_to_stop("e0")
    assert rec.error.startswith("2 resident request(s)")


def test_deadline_uses_monotonic_clock_not_wall() -> None:
    m, sched, clock = machine()
    sched.engines["e0"].resident_prefill = 1
    m.begin(["e0"], False, 5)
    m.record_old_identity("e0", 1000.0)
    clock.jump_wall(3600)  # NTP step: the wall moves, the drain deadline does not
    m.refresh()
    assert m.state("e0") == "draining"


def test_capture_failure_blocks_and_same_drain_retries() -> None:
    m, sched, _ = machine()
    m.begin(["e1"], False, 300)
    assert m.pending_identity(["e1"], False) == ["e1"]
    assert m.bind_capture("e1", "process identity unreadable: ConnectError") != ""
    rec = m.records["e1"]
    assert rec.state == "blocked" and rec.error == "process identity unreadable: ConnectError"
    assert "e1" in sched.draining
    assert m.begin(["e1"], False, 300) is False  # identity retry: no new record
    assert m.records["e1"] is rec
    assert m.bind_capture("e1", 1234.0) == ""
    assert rec.state == "drained" and rec.error == "" and rec.old_process_start == 1234.0
    assert actions(m) == ["drain_started", "drain_blocked", "process_recorded", "drain_complete"]


def test_ejected_member_uses_last_verified_identity() -> None:
    m, sched, _ = machine()
    m.process_starts = {"e0": 10.0, "e1": 11.0, "e2": 12.0}
    sched.ejected["e2"] = "liveness"
    m.begin([], True, 300)
    assert m.bind_capture("e2", "process identity unreadable: ConnectError") == ""
    assert m.records["e2"].old_process_start == 12.0
    del m.process_starts["e1"]
    sched.ejected["e1"] = "liveness"
    assert m.bind_capture("e1", "process identity unreadable: ConnectError") != ""


def test_wave_drain_holds_fleet_and_signals_once() -> None:
    m, sched, _ = machine()
    m.begin([], True, 300)
    wave = m.wave_id
    assert wave.startswith("wave-") and len(wave) == 17
    assert sched.fleet_hold == f"whole-wave drain {wave}" and sched.eligible() == []
    for i, iid in enumerate(["e0", "e1"]):
        m.record_old_identity(iid, 100.0 + i)
    assert not m.wave_ready_to_stop() and not m.ready_to_stop("e0")  # e2 pending
    m.record_old_identity("e2", 102.0)
    assert m.wave_ready_to_stop() and all(m.ready_to_stop(i) for i in ("e0", "e1", "e2"))
    m.refresh()
    assert actions(m).count("wave_ready_to_stop") == 1
    assert actions(m)[:4] == ["drain_started", "drain_started", "drain_started", "wave_started"]


def test_promotion_of_individual_hold_keeps_identity() -> None:
    m, sched, _ = machine(n=2)
    m.begin(["e0"], False, 300)
    m.record_old_identity("e0", 50.0)
    with pytest.raises(LifecycleError, match="already active for e0"):
        m.begin([], True, 300)  # e1 is still eligible: no promotion
    sched.ejected["e1"] = "liveness"
    assert m.begin([], True, 300) is True
    assert m.wave_id and m.records["e0"].old_process_start == 50.0 and m.records["e0"].wave_id == m.wave_id
    assert m.records["e1"].old_process_start is None


def readmit_ok(m: object, targets: list[str], start: float = 2000.0) -> bool:
    return m.complete_validation(  # type: ignore[attr-defined, no-any-return]
        {i: Verdict(checks=["health"], process_start=start + n) for n, i in enumerate(targets)}
    )


def test_readmit_shapes() -> None:
    m, _, _ = machine()
    cases = [
        ((["e0"], False), "e0 is active, expected drained"),
        (([], False), "readmission must name exactly one engine"),
        ((["e0", "e1"], False), "readmission must name exactly one engine"),
        (([], True), "whole-wave readmission must name the active wave's complete engine set"),
        ((["x"], False), "unknown engine(s): x"),
    ]
    for (engines, wave), message in cases:
        with pytest.raises(LifecycleError) as err:
            m.mark_validating(engines, wave)
        assert str(err.value) == message
    m.begin(["e0"], False, 300)
    with pytest.raises(LifecycleError, match="e0 is draining, expected drained"):
        m.mark_validating(["e0"], False)


def test_readmit_success_and_failure_paths() -> None:
    m, sched, _ = machine()
    m.begin(["e0"], False, 300)
    m.record_old_identity("e0", 100.0)
    assert m.mark_validating(["e0"], False) == ["e0"]
    assert m.state("e0") == "validating" and "e0" in sched.draining
    assert not m.complete_validation(
        {"e0": Verdict(checks=["health"], errors=["engine process did not restart after drain"])}
    )
    rec = m.records["e0"]
    assert rec.state == "blocked" and rec.error == "engine process did not restart after drain"
    assert rec.checks == ["health"] and "e0" in sched.draining
    m.mark_validating(["e0"], False)  # repeatable from blocked, stale error cleared
    assert rec.error == "" and rec.checks == []
    sched.ejected["e0"] = "liveness"
    assert readmit_ok(m, ["e0"])
    assert rec.state == "active" and rec.new_process_start == 2000.0 and m.process_starts["e0"] == 2000.0
    assert "e0" not in sched.draining and "e0" not in sched.ejected and sched.accepts_new("e0")
    assert actions(m)[-1] == "readmitted"


def test_missing_start_fails_validation() -> None:
    m, _, _ = machine()
    m.begin(["e0"], False, 300)
    m.record_old_identity("e0", 100.0)
    m.mark_validating(["e0"], False)
    assert not m.complete_validation({"e0": Verdict(checks=["health"])})
    assert m.state("e0") == "blocked"


def test_wave_readmission_all_or_nothing() -> None:
    m, sched, _ = machine()
    m.begin([], True, 300)
    for i in ("e0", "e1", "e2"):
        m.record_old_identity(i, 10.0)
    with pytest.raises(LifecycleError, match="an active whole wave must be validated"):
        m.mark_validating(["e0"], False)
    with pytest.raises(LifecycleError, match="complete engine set"):
        m.mark_validating(["e0", "e1"], True)
    m.mark_validating([], True)
    ok = m.complete_validation(
        {
            "e0": Verdict(checks=["health"], process_start=20.0),
            "e1": Verdict(checks=["health"], errors=["serves ['x'], expected fake"], process_start=21.0),
            "e2": Verdict(checks=["health"], process_start=22.0),
        }
    )
    assert not ok
    assert m.records["e1"].error == "serves ['x'], expected fake"
    assert m.records["e0"].error == WAVE_PEER_FAILED == m.records["e2"].error
    assert sched.fleet_hold and m.wave_id and sched.draining == {"e0", "e1", "e2"}
    wave = m.wave_id
    m.mark_validating(["e2", "e1", "e0"], True)
    assert readmit_ok(m, ["e0", "e1", "e2"])
    assert m.wave_id == "" and sched.fleet_hold == "" and sched.draining == set()
    assert all(r.wave_id == "" and r.state == "active" for r in m.records.values())
    last = m.events[-1]
    assert last["action"] == "wave_readmitted" and last["wave_id"] == wave


def test_require_restart_wave_and_identity_retry() -> None:
    m, sched, _ = machine(policy="whole_wave")
    assert m.require_restart_wave("engine e1 was excluded")
    wave = m.wave_id
    assert sched.fleet_hold == "whole-wave restart required: engine e1 was excluded"
    assert all(
        r.state == "blocked" and r.restart_required and r.old_process_start is None
        for r in m.records.values()
    )
    assert not m.require_restart_wave("again")
    assert m.wave_id == wave
    with pytest.raises(LifecycleError, match="whole-wave recovery requires recorded pre-restart identities"):
        m.mark_validating([], True)
    with pytest.raises(LifecycleError, match="engine_restart_policy requires a whole-wave drain"):
        m.begin(["e0"], False, 300)
    assert m.begin([], True, 300) is False  # capture identities under the existing hold
    for i in ("e0", "e1", "e2"):
        m.bind_capture(i, 5.0)
    assert m.wave_id == wave and m.wave_ready_to_stop()
    assert m.require_restart_wave("identity changed", reset=True)
    assert m.wave_id != wave


def test_recovery_validation_rules() -> None:
    m, sched, _ = machine()
    with pytest.raises(LifecycleError, match="recovery requires an ejected engine"):
        m.start_recovery(["e1"], False)
    sched.ejected["e1"] = "liveness"
    assert m.start_recovery(["e1"], False) == ["e1"]
    rec = m.records["e1"]
    assert rec.state == "validating" and rec.restart_required is False and rec.deadline_at == rec.requested_at
    with pytest.raises(LifecycleError):
        m.start_recovery(["e1"], False)
    assert not m.complete_validation({"e1": Verdict(errors=["health did not answer 200"])})
    assert rec.state == "blocked" and "e1" in sched.draining
    sched.ejected["e2"] = "liveness"
    assert m.start_recovery(["e2"], False) == ["e2"]  # others' failed recovery does not block
    assert readmit_ok(m, ["e2"])
    assert "e2" not in sched.ejected
    with pytest.raises(LifecycleError):
        m.start_recovery(["e1"], False)  # its own failed record needs an operator readmit
    m.mark_validating(["e1"], False)  # no identity needed: restart_required is false
    assert readmit_ok(m, ["e1"])


def test_whole_wave_policy_refuses_automatic_recovery() -> None:
    m, sched, _ = machine(policy="whole_wave")
    sched.ejected["e1"] = "liveness"
    with pytest.raises(LifecycleError):
        m.start_recovery(["e1"], False)


def test_snapshot_restore_roundtrip_interrupts_validation() -> None:
    m, _sched, clock = machine()
    m.process_starts = {"e0": 1.0, "e1": 2.0, "e2": 3.0}
    m.begin(["e0"], False, 300)
    m.record_old_identity("e0", 1.0)
    m.mark_validating(["e0"], False)
    section = m.snapshot()
    m2, sched2, _ = machine()
    m2.clock = clock
    m2.restore(section.model_dump())
    rec = m2.records["e0"]
    assert rec.state == "blocked" and rec.error == INTERRUPTED and rec.old_process_start == 1.0
    assert sched2.draining == {"e0"} and m2.process_starts == m.process_starts
    assert list(m2.events) == list(m.events)


def test_restore_wave_sets_fleet_hold() -> None:
    m, _, _ = machine()
    m.begin([], True, 300)
    section = m.snapshot()
    m2, sched2, _ = machine()
    m2.restore(section)
    assert sched2.fleet_hold == f"whole-wave drain {m.wave_id}" and m2.wave_id == m.wave_id
    assert sched2.draining == {"e0", "e1", "e2"}
