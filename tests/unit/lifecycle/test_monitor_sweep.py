"""The liveness sweep's identity reads (spec §7.2): what it asks an engine, and what it catches."""

from __future__ import annotations

from typing import Any

from router.clock import FakeClock
from router.core import RouterCore
from router.engines.control import EngineControl
from router.journal import Journal
from router.lifecycle.monitor import LifecycleMonitor
from router.lifecycle.service import LifecycleService

from .fake_engines import FakeFleet
from .helpers import fleet

IDENTITY_READS = ("GET /version", "GET /metrics", "GET /att")


def setup() -> tuple[RouterCore, LifecycleMonitor, FakeFleet]:
    cfg = fleet(3, contract=True, recovery={"liveness_every": 1})
    core = RouterCore(config=cfg, journal=Journal(None), clock=FakeClock())
    fake = FakeFleet(3)
    service = LifecycleService(core, control=EngineControl(cfg, transport=fake.transport()))
    return core, LifecycleMonitor(core, service), fake


def identity_reads(fake: FakeFleet, iid: str) -> list[str]:
    """The identity reads ``iid`` answered since the last call."""
    calls = [c for c in fake.engines[iid].calls if c in IDENTITY_READS]
    fake.engines[iid].calls = [c for c in fake.engines[iid].calls if c not in IDENTITY_READS]
    return calls


def excluded(monitor: LifecycleMonitor) -> list[dict[str, Any]]:
    return [dict(e) for e in monitor.machine.events if e.get("action") == "process_excluded"]


async def test_an_unchanged_verified_process_is_asked_its_start_only() -> None:
    core, monitor, fake = setup()
    await monitor.pass_once()  # start-up: the full check of every engine, then the first sweep
    assert core.identities_ready
    full = ["GET /version", "GET /metrics", "GET /att"]
    assert all(identity_reads(fake, i) == [*full, "GET /metrics"] for i in fake.engines)
    for e in fake.engines.values():
        e.calls.clear()
    for _ in range(3):
        await monitor.pass_once()
    assert all(identity_reads(fake, i) == ["GET /metrics"] * 3 for i in fake.engines)
    assert not core.scheduler.ejected and not excluded(monitor)
    # the served-model check and the liveness probe still run on every sweep
    assert fake.engines["e0"].calls.count("GET /health") == 3
    assert fake.engines["e0"].calls.count("GET /v1/models") == 3


async def test_a_process_restarted_behind_the_router_is_ejected_on_the_next_sweep() -> None:
    core, monitor, fake = setup()
    await monitor.pass_once()
    before = monitor.machine.process_starts["e1"]
    fake.engines["e1"].restart()
    await monitor.pass_once()
    assert core.scheduler.ejected == {"e1": "process_identity"}
    (row,) = excluded(monitor)
    assert row["iid"] == "e1" and row["previous_process_start"] == before
    assert row["observed_process_start"] == fake.engines["e1"].start
    assert monitor.machine.process_starts["e1"] == before  # not accepted: readmission validates it
    assert "GET /att" in fake.engines["e1"].calls  # the new process got the full check


async def test_the_cheap_read_needs_the_accepted_process_to_be_the_verified_one() -> None:
    core, monitor, fake = setup()
    await monitor.pass_once()
    for iid in fake.engines:
        identity_reads(fake, iid)
    # a readmission accepted another process (the machine's accepted start moved): full check again
    monitor.machine.process_starts["e2"] += 50.0
    fake.engines["e2"].start = monitor.machine.process_starts["e2"]
    await monitor.pass_once()
    assert identity_reads(fake, "e2") == ["GET /version", "GET /metrics", "GET /att"]
    assert identity_reads(fake, "e0") == ["GET /metrics"]
    assert not core.scheduler.ejected
    await monitor.pass_once()
    assert identity_reads(fake, "e2") == ["GET /metrics"]


async def test_an_unreadable_start_still_ejects_on_a_contracted_fleet() -> None:
    core, monitor, fake = setup()
    await monitor.pass_once()
    identity_reads(fake, "e0")
    fake.engines["e0"].metrics_ok = False
    await monitor.pass_once()
    assert core.scheduler.ejected == {"e0": "process_identity"}  # unverifiable on a contracted fleet
    assert identity_reads(fake, "e0") == ["GET /metrics"]
