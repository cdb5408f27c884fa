"""After a claim the shared handoff is read again until it can be read: a re-claim or a standby
takeover never resumes over an unreadable copy, and the standby reads it *after* claiming (the
machine's rule, router/ha/machine.py ``_read``). Real file lease, fake clock, no real sleeps."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from router.clock import FakeClock
from router.ha import statefile
from router.ha.handoff import validate
from router.ha.lease import Lease, LeaseError, LeaseSettings
from router.ha.lease_backend import FileLease
from router.ha.persist import FileHandoffStore
from tests.unit.ha.helpers import core, fixture
from tests.unit.ha.test_service import _lease, _service, _standby

UNREADABLE = statefile.StateRead(None, "unreadable", "router.lease.handoff.json: Permission denied")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _flaky_reads(store: FileHandoffStore, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """The store answers ``unreadable`` (EACCES, EMFILE) while ``left`` > 0, then reads the file."""
    state = {"left": 0, "reads": 0}
    real_read = store.read

    async def read() -> statefile.StateRead:
        state["reads"] += 1
        if state["left"] > 0:
            state["left"] -= 1
            return UNREADABLE
        return await real_read()

    monkeypatch.setattr(store, "read", read)
    return state


def _fake_sleep(monkeypatch: pytest.MonkeyPatch, clock: FakeClock, step: float) -> None:
    async def fake_sleep(_: float) -> None:
        clock.advance(step)

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)


async def test_a_reclaim_over_an_unreadable_handoff_applies_the_change_acknowledged_meanwhile(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Router a loses its lease to local store errors; meanwhile router b claims epoch 2 and
    acknowledges a drain (written to the shared handoff) and stops. When a claims again, the shared
    handoff is unreadable for a moment: a must read it again and apply b's drain, not resume with
    its own older state."""
    c = core(clock=clock)
    ha = _service(tmp_path, c)
    await ha.start()
    assert ha.lease is not None and ha.keeper is not None and isinstance(ha.shared, FileHandoffStore)
    assert isinstance(ha.lease, FileLease)
    for task in ha._tasks:
        task.cancel()
    lease = ha.lease.lease
    reads = _flaky_reads(ha.shared, monkeypatch)
    real_update = lease.backend.update
    failures = {"left": 8}  # 8 × 0.2 s: past a's validity and its record's expiry
    renewals = {"ok": 0}

    def b_acknowledges_a_drain() -> None:
        b = Lease(LeaseSettings(str(tmp_path / "router.lease"), "router-b", 1.0, 0.2, 0.1), clock=clock)
        assert b.claim(1) and b.epoch == 2
        raw = fixture("handoff_after_resume.json") | {"epoch": 2, "holder": b.holder, "at": clock.wall()}
        statefile.write(tmp_path / "router.lease.handoff.json", validate(raw))  # b's acknowledged drain
        b.release()
        reads["left"] = 2  # unreadable at a's epoch floor and at its first read after the claim

    def flaky(fn: Any) -> Any:
        if failures["left"] > 0:
            failures["left"] -= 1
            if failures["left"] == 0:
                b_acknowledges_a_drain()
            raise LeaseError("cannot open lease lock: Too many open files")
        written = real_update(fn)
        renewals["ok"] += 1
        if renewals["ok"] >= 3:
            lease.owned = False  # end the hand-driven loop
        return written

    monkeypatch.setattr(lease.backend, "update", flaky)
    _fake_sleep(monkeypatch, clock, 0.2)
    await ha.keeper.renew_forever()
    monkeypatch.undo()
    assert ha.keeper.reclaims == 1 and lease.epoch == 3
    assert reads["left"] == 0 and reads["reads"] >= 3  # read again, not skipped
    assert "e2" in c.scheduler.draining  # b's acknowledged drain survived a's re-claim
    assert c.counters.values["served"] == 20
    assert c.control.failover_blocked == "" and not c.control.standby
    await ha.stop()


async def test_a_reclaim_whose_lease_runs_out_while_the_handoff_stays_unreadable_releases_and_retries(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never controlling without the durable state: while the shared handoff stays unreadable the
    re-claimed lease is not used; when it runs out it is released, and the next claim (a higher
    epoch) reads the handoff and applies it."""
    c = core(clock=clock)
    ha = _service(tmp_path, c)
    await ha.start()
    assert ha.lease is not None and ha.keeper is not None and isinstance(ha.shared, FileHandoffStore)
    for task in ha._tasks:
        task.cancel()
    raw = fixture("handoff_after_resume.json") | {"epoch": 2, "holder": "router-b:1", "at": clock.wall()}
    statefile.write(tmp_path / "router.lease.handoff.json", validate(raw))
    reads = _flaky_reads(ha.shared, monkeypatch)
    reads["left"] = 8  # unreadable past the fresh claim's 0.9 s validity
    _fake_sleep(monkeypatch, clock, 0.2)
    seen: list[tuple[bool, str]] = []
    real_read = ha.shared.read

    async def watching_read() -> statefile.StateRead:
        seen.append((c.controls_fleet(), c.control.failover_blocked))
        return await real_read()

    monkeypatch.setattr(ha.shared, "read", watching_read)
    clock.advance(1.0)  # a's record expired; it lost the lease to a local error
    ha.lease.owned = False
    c.control.failover_blocked = "lease renewal failing: [Errno 24] Too many open files"  # (renew_forever)
    assert await ha.keeper.claim_until_held(1)
    monkeypatch.undo()
    assert all(not controls for controls, _ in seen)  # never controlling while it could not read
    assert any("handoff unreadable" in why for _, why in seen)
    assert ha.lease.epoch >= 3  # released and claimed again above the first re-claim
    assert "e2" in c.scheduler.draining and c.controls_fleet()
    await ha.stop()


async def test_standby_whose_shared_read_fails_at_takeover_reads_it_again_instead_of_the_poll(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The poll is fresh and from the last epoch, but a drain was acknowledged after it (in the
    shared handoff). A failed read of the shared copy must not let the poll win."""
    primary = _lease(tmp_path, clock, "router-a")
    assert primary.claim()
    poll = fixture("handoff_initial.json") | {"epoch": 1, "holder": primary.holder, "at": clock.wall()}
    loop, ha = await _standby(tmp_path, clock, poll)
    acked = fixture("handoff_after_resume.json") | {
        "epoch": 1,
        "holder": primary.holder,
        "at": clock.wall() + 0.5,
    }
    clock.advance(1.5)  # the primary acknowledged a drain, then died; its lease expired
    statefile.write(tmp_path / "router.lease.handoff.json", validate(acked))
    assert isinstance(loop.shared, FileHandoffStore)
    reads = _flaky_reads(loop.shared, monkeypatch)
    reads["left"] = 2
    _fake_sleep(monkeypatch, clock, 0.05)
    assert await loop.try_takeover()
    monkeypatch.undo()
    c = loop.core
    assert c.controls_fleet() and c.control.epoch == 2
    assert "e2" in c.scheduler.draining and c.counters.values["served"] == 20
    await ha.stop()


async def test_standby_reads_the_shared_handoff_after_claiming(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drain the primary acknowledges just before the standby's claim commits (after any read
    made before the claim) is in the state the standby takes over with."""
    primary = _lease(tmp_path, clock, "router-a")
    assert primary.claim()
    poll = fixture("handoff_initial.json") | {"epoch": 1, "holder": primary.holder, "at": clock.wall()}
    loop, ha = await _standby(tmp_path, clock, poll)
    clock.advance(1.5)  # the primary's lease expired (it is about to write one last ack)
    acked = fixture("handoff_after_resume.json") | {"epoch": 1, "holder": primary.holder, "at": clock.wall()}
    real_claim = loop.lease.claim

    async def claim(floor: int = 0) -> bool:
        statefile.write(tmp_path / "router.lease.handoff.json", validate(acked))  # lands before the claim
        return await real_claim(floor)

    monkeypatch.setattr(loop.lease, "claim", claim)
    assert await loop.try_takeover()
    c = loop.core
    assert c.controls_fleet() and c.control.epoch == 2
    assert "e2" in c.scheduler.draining and c.counters.values["served"] == 20
    await ha.stop()


async def test_a_reclaim_over_a_damaged_handoff_written_after_another_holders_epoch_is_refused(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Router b held epoch 2 while a was cut off; the shared copy is now torn (it may have held b's
    acknowledged changes): a does not resume with its own older state."""
    c = core(clock=clock)
    ha = _service(tmp_path, c)
    await ha.start()
    assert ha.lease is not None and ha.keeper is not None
    for task in ha._tasks:
        task.cancel()
    clock.advance(1.0)  # a's record expired; it lost the lease to a local error
    ha.lease.owned = False
    c.control.failover_blocked = "lease renewal failing: [Errno 24] Too many open files"
    b = Lease(LeaseSettings(str(tmp_path / "router.lease"), "router-b", 1.0, 0.2, 0.1), clock=clock)
    assert b.claim(1) and b.epoch == 2
    b.release()
    (tmp_path / "router.lease.handoff.json").write_bytes(b'{"schema": "narwhal.handoff", "ep')
    assert not await ha.keeper.claim_until_held(1)
    assert not c.controls_fleet() and c.health_status() == "fenced"
    assert c.control.failover_blocked.startswith(
        "lease claimed again, but the shared handoff is unusable after epoch 2 of another holder: "
        "handoff file torn: "
    )
    await ha.stop()
