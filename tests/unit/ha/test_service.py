"""HA component in-process on a fake clock: startup claim/fencing, renewal fencing, shutdown writes,
--resume rules, standby probe verdicts and the takeover sequence (no HTTP, no real sleeps)."""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from router.clock import FakeClock
from router.ha import statefile
from router.ha.handoff import HandoffVersionError, validate
from router.ha.lease import Lease, LeaseError, LeaseSettings
from router.ha.lease_backend import FileLease
from router.ha.service import HAService
from router.ha.settings import HARuntime
from router.ha.standby import StandbyLoop, judge_probe, takeover_handoff
from tests.unit.ha.helpers import HACore, core, fixture, fleet, machine

FAST = {"lease_ttl_s": 1.0, "lease_renew_interval_s": 0.2, "lease_safety_margin_s": 0.1}


def _runtime(tmp_path: Path, name: str = "a", lease: bool = True, **kw: Any) -> HARuntime:
    values: dict[str, Any] = {
        "state_path": str(tmp_path / f"{name}.state.json"),
        "lease_path": str(tmp_path / "router.lease") if lease else "",
        "router_id": f"router-{name}",
        **FAST,
    }
    values.update(kw)
    return HARuntime(**values)


def _service(tmp_path: Path, c: HACore, name: str = "a", **kw: Any) -> HAService:
    return HAService(c, _runtime(tmp_path, name, **kw), lifecycle=c.lifecycle)


def _lease(tmp_path: Path, clock: FakeClock, router_id: str = "other") -> Lease:
    settings = LeaseSettings(str(tmp_path / "router.lease"), router_id, 1.0, 0.2, 0.1)
    return Lease(settings, clock=clock)


def _exists(path: str) -> bool:
    return Path(path).exists()


def _load(path: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(path).read_text())
    return data


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def test_active_router_claims_and_writes_latest_counters_at_shutdown(
    tmp_path: Path, clock: FakeClock
) -> None:
    c = core(clock=clock)
    ha = _service(tmp_path, c)
    assert not c.controls_fleet()  # before start: no control
    await ha.start()
    assert c.controls_fleet() and c.control.epoch == 1 and c.control.holder.startswith("router-a:")
    c.counters.finish("served")
    await ha.stop()
    doc = _load(ha.settings.state_path)
    assert doc["counters"]["served"] == 1 and doc["epoch"] == 1
    lease = _load(str(tmp_path / "router.lease"))
    assert lease["expires_at"] == clock.wall()  # released


async def test_router_without_lease_controls_and_persists(tmp_path: Path, clock: FakeClock) -> None:
    c = core(clock=clock)
    ha = _service(tmp_path, c, lease=False)
    await ha.start()
    assert c.controls_fleet() and c.control.epoch == 0
    assert await ha.persist() is True
    await ha.stop()
    assert _load(ha.settings.state_path)["holder"] == ""


async def _until(what: str, cond: Any, within_s: float = 10.0) -> None:
    """Let the background claim task run (it sleeps for real between tries) until ``cond()``."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + within_s
    while not cond():
        assert loop.time() < give_up, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def test_router_finding_the_lease_renewed_by_its_holder_is_fenced_for_good(
    tmp_path: Path, clock: FakeClock
) -> None:
    other = _lease(tmp_path, clock)
    assert other.claim()
    c = core(clock=clock)
    ha = _service(tmp_path, c)
    await ha.start()
    assert not c.controls_fleet()
    assert c.control.failover_blocked.startswith("lease held by another router: waiting for its lease")
    assert f"fenced for good if {other.holder} renews it" in c.control.failover_blocked
    clock.advance(0.1)
    assert other.renew()  # the holder is alive
    await _until("fenced", lambda: c.control.failover_blocked == "lease held by another router")
    assert c.health_status() == "fenced" and c.ready_reason() == "lease held by another router"
    assert c.prefill_hold_reason() == "lease held by another router"
    other.release()
    clock.advance(5.0)
    await asyncio.sleep(0.2)
    assert not c.controls_fleet()  # never re-claims
    assert await ha.persist() is False
    await ha.stop()
    assert not _exists(ha.settings.state_path)


async def test_router_finding_the_lease_of_a_gone_holder_waits_and_claims_above_it(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Both routers restarted within the TTL: the record of the old process is waited out (it is
    never renewed) and claimed at a higher epoch, then ``--resume`` applies the newest state."""
    other = _lease(tmp_path, clock)
    assert other.claim() and other.epoch == 1
    newest = fixture("handoff_after_resume.json") | {"epoch": 1, "holder": other.holder, "at": clock.wall()}
    statefile.write(tmp_path / "router.lease.handoff.json", validate(newest))  # its durable copy
    c = core(clock=clock)
    ha = _service(tmp_path, c, resume=True)
    await ha.start()
    assert not c.controls_fleet() and "waiting for its lease to expire" in c.control.failover_blocked
    clock.advance(0.5)
    await asyncio.sleep(0.2)
    assert not c.controls_fleet()  # not before it expired
    clock.advance(1.0)  # past the old record's expiry, never renewed
    await _until("claimed", c.controls_fleet)
    assert c.control.epoch == 2 and c.control.failover_blocked == ""
    assert ha.resume_result is not None and ha.resume_result[0], ha.resume_result
    assert "e2" in c.scheduler.draining and c.counters.values["served"] == 20
    await ha.stop()


async def test_lease_expired_during_cleanup_means_no_final_write(tmp_path: Path, clock: FakeClock) -> None:
    c = core(clock=clock)
    ha = _service(tmp_path, c)
    await ha.start()
    assert _load(ha.settings.state_path)["epoch"] == 1  # the claimed epoch, written at once
    c.counters.finish("served")
    await ha._on_shutdown(None)  # type: ignore[arg-type]
    clock.advance(0.95)  # past ttl − margin: locally invalid
    await ha.stop()
    assert _load(ha.settings.state_path)["counters"]["served"] == 0  # no final write


async def _drive_renewal(
    ha: HAService, monkeypatch: pytest.MonkeyPatch, clock: FakeClock, step: float
) -> None:
    """Run the renewal loop by hand: each sleep advances the fake clock instead of waiting."""
    for task in ha._tasks:
        task.cancel()

    async def fake_sleep(_: float) -> None:
        clock.advance(step)

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    assert ha.keeper is not None
    await ha.keeper.renew_forever()
    monkeypatch.undo()


async def test_renewal_seeing_another_holder_fences_at_once(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = core(clock=clock)
    ha = _service(tmp_path, c)
    await ha.start()
    record = json.loads((tmp_path / "router.lease").read_text())
    (tmp_path / "router.lease").write_text(json.dumps(record | {"holder": "thief:1", "epoch": 2}))
    await _drive_renewal(ha, monkeypatch, clock, 0.2)
    assert c.control.failover_blocked == "lease renewal failed" and not c.controls_fleet()
    assert c.health_status() == "fenced"
    await ha.stop()


async def test_holder_rewrites_a_vanished_lease_record(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = core(clock=clock)
    ha = _service(tmp_path, c)
    await ha.start()
    assert ha.lease is not None and ha.keeper is not None
    (tmp_path / "router.lease").unlink()
    calls = 0
    real_renew = ha.lease.renew

    def renew_then_stop() -> bool:
        nonlocal calls
        calls += 1
        ok = real_renew()
        if calls >= 2:
            ha.lease.owned = False  # end the hand-driven loop
        return ok

    monkeypatch.setattr(ha.lease, "renew", renew_then_stop)
    await _drive_renewal(ha, monkeypatch, clock, 0.2)
    assert _load(str(tmp_path / "router.lease"))["epoch"] == 1
    assert "rewritten by the holder at epoch 1" in ha.lease.recovered
    await ha.stop()


async def test_transient_renewal_errors_are_retried_and_a_local_loss_claims_again(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = core(clock=clock)
    ha = _service(tmp_path, c)
    await ha.start()
    assert ha.lease is not None and ha.keeper is not None
    assert isinstance(ha.lease, FileLease)
    lease = ha.lease.lease  # the file lease behind the async seam
    real_update = lease.backend.update
    failures = {"left": 8}  # 8 failures × 0.2 s steps: past the 0.9 s validity, lost locally
    renewals = {"ok": 0}

    def flaky(fn: Any) -> Any:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise LeaseError("cannot open lease lock: Too many open files")
        written = real_update(fn)
        renewals["ok"] += 1
        if renewals["ok"] >= 3:
            lease.owned = False  # end the hand-driven loop
        return written

    monkeypatch.setattr(lease.backend, "update", flaky)
    await _drive_renewal(ha, monkeypatch, clock, 0.2)
    assert ha.keeper.renewal_errors >= 1 and ha.keeper.reclaims == 1
    assert lease.epoch == 2  # our record expired meanwhile: claimed again at the next epoch
    assert c.control.failover_blocked == "" and not c.control.standby
    await ha.stop()


async def test_local_deadline_loses_control_before_the_renewal_loop_notices(
    tmp_path: Path, clock: FakeClock
) -> None:
    c = core(clock=clock)
    ha = _service(tmp_path, c)
    await ha.start()
    clock.jump_wall(-3600)
    assert c.controls_fleet()
    clock.advance(0.91)
    assert not c.controls_fleet() and c.ready_reason() == "lease expired" and c.health_status() == "fenced"
    await ha.stop()


# -- resume -----------------------------------------------------------------------------------------


async def test_resume_applies_the_previous_epoch(tmp_path: Path, clock: FakeClock) -> None:
    first = core(clock=clock)
    a = _service(tmp_path, first)
    await a.start()
    first.counters.finish("served")
    assert machine(first).begin(["e1"], wave=False, deadline_s=60)
    machine(first).record_old_identity("e1", 1_700_000_000.0)
    await a.stop()
    second = core(clock=clock)
    b = _service(tmp_path, second, resume=True)
    await b.start()
    assert b.resume_result is not None and b.resume_result[0], b.resume_result
    assert second.control.epoch == 2 and second.counters.values["served"] == 1
    assert machine(second).records["e1"].state == "drained" and "e1" in second.scheduler.draining
    await b.stop()


async def test_resume_refuses_an_older_document_when_the_shared_copy_is_damaged(
    tmp_path: Path, clock: FakeClock
) -> None:
    raw = fixture("handoff_initial.json") | {"epoch": 1, "holder": "x:1"}
    statefile.write(tmp_path / "a.state.json", validate(raw))
    other = _lease(tmp_path, clock)
    for _ in range(3):  # the fleet moved on: epochs 1..3 held by others
        assert other.claim()
        other.release()
        other = _lease(tmp_path, clock)
    (tmp_path / "router.lease.handoff.json").write_bytes(b'{"schema": "narwhal.handoff", "sch')  # torn
    c = core(clock=clock)
    ha = _service(tmp_path, c, resume=True)
    await ha.start()
    assert c.control.epoch == 4
    assert ha.resume_result is not None and not ha.resume_result[0]
    assert ha.resume_result[1].startswith("handoff file torn: ")
    assert ha.resume_result[1].endswith("older than the lease's last epoch 3")
    await ha.stop()


async def test_resume_takes_the_newest_document_whichever_router_wrote_it(
    tmp_path: Path, clock: FakeClock
) -> None:
    # A held epoch 1 (its own state file), B took over at epoch 2 and drained e2 (shared copy)
    old = fixture("handoff_initial.json") | {"epoch": 1, "holder": "router-a:1", "at": clock.wall() - 10}
    statefile.write(tmp_path / "a.state.json", validate(old))
    newer = fixture("handoff_after_resume.json") | {"epoch": 2, "holder": "router-b:2", "at": clock.wall()}
    statefile.write(tmp_path / "router.lease.handoff.json", validate(newer))
    c = core(clock=clock)
    ha = _service(tmp_path, c, resume=True)
    await ha.start()
    assert ha.resume_result is not None and ha.resume_result[0], ha.resume_result
    assert c.control.epoch == 3  # above every epoch seen, though the lease file never existed
    assert "e2" in c.scheduler.draining and c.counters.values["served"] == 20
    await ha.stop()


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b'{"schema": "narwhal.handoff", "sche', "handoff file torn: "),
        (b"foreign", "handoff names"),
        (b"policy", "handoff engine restart policy mismatch"),
        (b"invalid", "handoff file invalid:"),
    ],
)
async def test_refused_state_file_on_a_contracted_fleet_holds_the_whole_wave(
    tmp_path: Path, clock: FakeClock, content: bytes, reason: str
) -> None:
    path = tmp_path / "a.state.json"
    raw = fixture("handoff_initial.json")
    if content == b"foreign":
        raw["engines"] = ["x0", "x1", "x2"]
        raw["roles"] = {"x0": "prefill", "x1": "decode", "x2": "decode"}
        raw["lifecycle"]["process_starts"] = {}
        content = json.dumps(raw).encode()
    elif content == b"policy":
        raw["lifecycle"]["engine_restart_policy"] = "whole_wave"
        content = json.dumps(raw).encode()
    elif content == b"invalid":
        raw["epoch"] = True
        content = json.dumps(raw).encode()
    path.write_bytes(content)
    c = core(fleet(contract=True), clock=clock)
    c.counters.finish("served")
    ha = _service(tmp_path, c, lease=False, resume=True)
    await ha.start()
    assert ha.resume_result is not None and not ha.resume_result[0]
    assert ha.resume_result[1].startswith(reason)
    assert c.counters.values["served"] == 1  # nothing half-applied
    assert c.scheduler.fleet_hold.startswith("whole-wave restart required: handoff rejected: ")
    assert not c.ready() and c.health_status() == "maintenance"
    assert (tmp_path / "a.state.json.rejected").read_bytes() == content
    await ha.stop()


async def test_missing_state_file_on_a_contracted_fleet_is_no_hold(tmp_path: Path, clock: FakeClock) -> None:
    c = core(fleet(contract=True), clock=clock)
    ha = _service(tmp_path, c, lease=False, resume=True)
    await ha.start()
    assert ha.resume_result == (False, "no handoff file") and c.scheduler.fleet_hold == ""
    await ha.stop()


# -- standby ----------------------------------------------------------------------------------------


def test_probe_verdicts(tmp_path: Path, clock: FakeClock) -> None:
    lease = _lease(tmp_path, clock, "primary")
    assert lease.claim()
    record = lease.peek()
    raw = fixture("handoff_initial.json") | {"epoch": lease.epoch, "holder": lease.holder}
    now = clock.wall()
    assert judge_probe(200, {}, raw, record, now).good
    assert judge_probe(503, {"control_ready": True}, raw, record, now).good  # maintenance still alive
    assert not judge_probe(503, {"control_ready": False}, raw, record, now).good
    assert not judge_probe(200, {}, raw | {"holder": "x"}, record, now).good
    assert not judge_probe(200, {}, raw | {"epoch": 9}, record, now).good
    assert not judge_probe(200, {}, raw, None, now).good
    assert not judge_probe(200, {}, raw, record, now + 5).good  # lease expired
    assert not judge_probe(200, {}, raw | {"epoch": True}, record, now).good
    with pytest.raises(HandoffVersionError):
        judge_probe(200, {}, raw | {"schema_version": 2}, record, now)


async def _standby(
    tmp_path: Path, clock: FakeClock, doc: dict[str, Any] | None
) -> tuple[StandbyLoop, HAService]:
    c = core(clock=clock)
    ha = _service(tmp_path, c, name="b", standby_of="http://primary.invalid")
    c.control.standby = True
    assert ha.lease is not None
    loop = StandbyLoop(c, ha.settings, ha.lease, ha.handover, ha._activate)
    ha.standby_loop = loop
    loop.doc = validate(doc) if doc is not None else None
    loop.last_good_mono = clock.monotonic()
    return loop, ha


async def test_takeover_claims_next_epoch_and_applies_the_snapshot(tmp_path: Path, clock: FakeClock) -> None:
    primary = _lease(tmp_path, clock, "router-a")
    assert primary.claim()
    raw = fixture("handoff_after_resume.json") | {"epoch": 1, "holder": primary.holder, "at": clock.wall()}
    loop, ha = await _standby(tmp_path, clock, raw)
    assert not await loop.try_takeover()  # primary's lease still stands: keep shadowing
    assert loop.core.control.standby
    clock.advance(1.5)  # primary died; its lease expired
    assert await loop.try_takeover()
    c = loop.core
    assert c.controls_fleet() and c.control.epoch == 2 and c.control.failover_blocked == ""
    assert c.counters.values["served"] == 20 and "e2" in c.scheduler.draining
    assert ha.takeover_gap_s == pytest.approx(1.5)
    assert any("narwhal_takeover_seconds 1.5" in line for line in ha.metric_lines())
    await ha.stop()
    assert _load(ha.settings.state_path)["epoch"] == 2


async def test_takeover_outlived_by_its_lease_is_retried_not_refused(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A loaded host: identity validation takes longer than the fresh lease's validity. The standby
    must not give up for good (no controller until a restart); it keeps shadowing and the next
    attempt takes over at a higher epoch."""
    primary = _lease(tmp_path, clock, "router-a")
    assert primary.claim()
    raw = fixture("handoff_after_resume.json") | {"epoch": 1, "holder": primary.holder, "at": clock.wall()}
    loop, ha = await _standby(tmp_path, clock, raw)
    clock.advance(1.5)  # primary died; its lease expired
    real_activate = loop.activate
    slow = {"left": 1}

    async def activate(lease: Any) -> str:
        if slow["left"]:
            slow["left"] -= 1
            clock.advance(5.0)  # validation outlives the lease
        return await real_activate(lease)

    loop.activate = activate
    assert not await loop.try_takeover()  # interrupted: keep shadowing, not refused for good
    c = loop.core
    assert c.control.standby and not c.controls_fleet()
    assert c.control.failover_blocked == "lease expired during identity validation"
    assert await loop.try_takeover()
    assert c.controls_fleet() and c.control.epoch == 3 and c.control.failover_blocked == ""
    assert "e2" in c.scheduler.draining  # the handoff's hold survived both attempts
    await ha.stop()


async def test_takeover_refuses_an_old_snapshot_when_the_shared_copy_is_damaged(
    tmp_path: Path, clock: FakeClock
) -> None:
    primary = _lease(tmp_path, clock, "router-a")
    assert primary.claim()
    primary.release()
    (tmp_path / "router.lease.handoff.json").write_bytes(b"")  # empty: may have held epoch 1's state
    raw = fixture("handoff_initial.json") | {"epoch": 0, "at": clock.wall()}  # not epoch 1
    loop, ha = await _standby(tmp_path, clock, raw)
    assert await loop.try_takeover()
    c = loop.core
    assert c.control.standby and c.control.failover_blocked.startswith("handoff file empty: ")
    assert c.control.failover_blocked.endswith("older than the lease's last epoch 1")
    assert not ha.lease.owned if ha.lease else False
    assert _load(str(tmp_path / "router.lease"))["expires_at"] == clock.wall()  # released at once
    assert c.counters.values["served"] == 0


async def test_no_fresh_handoff_blocks_takeover(tmp_path: Path, clock: FakeClock) -> None:
    loop, _ = await _standby(tmp_path, clock, None)
    assert not await loop.try_takeover()
    assert loop.core.control.failover_blocked == "no fresh handoff"
    old = fixture("handoff_initial.json") | {"at": clock.wall() - 31}
    loop.doc = validate(old)
    assert not await loop.try_takeover()
    assert not (tmp_path / "router.lease").exists()  # never claimed


async def test_a_blocked_takeover_says_why_once_per_reason(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A primary frozen (SIGSTOP) inside its locked lease update keeps the lock: every claim fails,
    and the standby logs why (once), not silence."""
    caplog.set_level(logging.WARNING, logger="narwhal.ha.standby")
    primary = _lease(tmp_path, clock, "router-a")
    assert primary.claim()
    raw = fixture("handoff_after_resume.json") | {"epoch": 1, "holder": primary.holder, "at": clock.wall()}
    loop, ha = await _standby(tmp_path, clock, raw)
    clock.advance(1.5)  # the primary's lease expired, but it still holds the lock file
    fd = os.open(tmp_path / "router.lease.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for _ in range(2):
            assert not await loop.try_takeover()
    finally:
        os.close(fd)
    blocked = [r.getMessage() for r in caplog.records if "takeover blocked" in r.getMessage()]
    assert len(blocked) == 1 and "lease unavailable: cannot claim lease: lease lock" in blocked[0]
    assert blocked[0].endswith("router.lease.lock busy for 1.0s")
    assert loop.core.control.failover_blocked.startswith("lease unavailable: ")
    assert await loop.try_takeover()  # the lock is free again: taken over
    assert loop.core.controls_fleet() and loop.core.control.epoch == 2
    await ha.stop()


async def test_takeover_refuses_a_foreign_fleet_and_stays_standby(tmp_path: Path, clock: FakeClock) -> None:
    raw = fixture("handoff_initial.json") | {"epoch": 0, "holder": "", "at": clock.wall(), "model": "other"}
    loop, ha = await _standby(tmp_path, clock, raw)
    assert await loop.try_takeover()
    assert loop.core.control.standby and loop.core.control.failover_blocked.startswith("handoff model")
    assert ha.lease is not None and not ha.lease.owned


async def test_standby_and_fenced_never_persist(tmp_path: Path, clock: FakeClock) -> None:
    _, ha = await _standby(tmp_path, clock, None)
    assert await ha.persist() is False
    await ha.stop()
    assert not _exists(ha.settings.state_path)


async def test_handoff_route_serves_any_role(tmp_path: Path, clock: FakeClock) -> None:
    _, ha = await _standby(tmp_path, clock, None)
    resp = await ha.handoff_route(None)  # type: ignore[arg-type]
    assert resp.status == 200
    assert resp.body is not None
    body = json.loads(bytes(resp.body))  # type: ignore[arg-type]
    assert (
        body["epoch"] == 0
        and body["holder"] == ""
        and body == ha.handover.build().dump() | {"at": body["at"]}
    )


async def test_standby_tasks_end_cleanly(tmp_path: Path, clock: FakeClock) -> None:
    _, ha = await _standby(tmp_path, clock, None)
    await asyncio.sleep(0)
    await ha.stop()


def test_takeover_handoff_ages_out_polls_but_never_the_durable_copy() -> None:
    now = 1_800_000_100.0
    base = fixture("handoff_initial.json")
    old_poll = validate(base | {"epoch": 1, "holder": "router-a:1", "at": now - 60})
    fresh_poll = validate(base | {"epoch": 1, "holder": "router-a:1", "at": now - 1})
    durable = validate(base | {"epoch": 1, "holder": "router-a:1", "at": now - 50})
    assert takeover_handoff(old_poll, None, now, 30.0) is None  # "no fresh handoff"
    assert takeover_handoff(fresh_poll, None, now, 30.0) is fresh_poll
    assert takeover_handoff(None, durable, now, 30.0) is durable  # written before every acknowledgement
    assert takeover_handoff(old_poll, durable, now, 30.0) is durable  # the newer of the two
    assert takeover_handoff(fresh_poll, durable, now, 30.0) is fresh_poll
    assert takeover_handoff(None, None, now, 30.0) is None
