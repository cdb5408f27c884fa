"""Acknowledged means durable: a lifecycle change whose state write fails answers 503, is undone in
memory (a repeat starts from the same state), and is refused while writes keep failing."""

from __future__ import annotations

import httpx

from router.core import RouterCore
from router.engines.control import EngineControl
from router.ha.persist import PersistError
from router.journal import Journal
from router.lifecycle.service import LifecycleService

from .fake_engines import FakeFleet
from .helpers import fleet


class FlakyStore:
    """A persist hook like HA's: raises PersistError while ``broken``, records successful writes."""

    def __init__(self, core: RouterCore) -> None:
        self.core = core
        self.broken = ""
        self.writes: list[list[str]] = []  # held engines at each successful write

    async def __call__(self) -> bool:
        if self.broken:
            self.core.persist_degraded = f"state not persisted: {self.broken}"
            raise PersistError(self.core.persist_degraded)
        self.core.persist_degraded = ""
        self.writes.append(sorted(self.core.scheduler.draining))
        return True


def _service() -> tuple[LifecycleService, FlakyStore, FakeFleet]:
    fake = FakeFleet(3)
    core = RouterCore(config=fleet(contract=True), journal=Journal(None))
    service = LifecycleService(core, control=EngineControl(core.config, httpx.MockTransport(fake.handle)))
    service.machine.process_starts = {i: e.start for i, e in fake.engines.items()}
    store = FlakyStore(core)
    service.persist_hooks.append(store)
    return service, store, fake


async def test_unpersisted_drain_answers_503_and_is_undone() -> None:
    service, store, _ = _service()
    store.broken = "[Errno 28] No space left on device"
    status, doc = await service.drain(["e1"], wave=False, deadline_s=30)
    assert status == 503
    assert (
        doc.error
        == "state not persisted: [Errno 28] No space left on device; change undone, repeat the request"
    )
    assert "e1" not in service.core.scheduler.draining  # back in placement: nothing was acknowledged
    assert service.machine.state("e1") == "active" and store.writes == []
    # while writes keep failing every change is refused before it starts
    status, doc = await service.drain(["e1"], wave=False, deadline_s=30)
    assert status == 503 and doc.error.endswith("; lifecycle changes refused until a state write succeeds")
    assert service.machine.state("e1") == "active"
    # the disk recovers: the same request now succeeds and is durable before the answer
    store.broken = ""
    status, doc = await service.drain(["e1"], wave=False, deadline_s=30)
    assert status == 200, doc.error
    assert store.writes[-1] == ["e1"] and service.machine.state("e1") in ("draining", "drained")


async def test_unpersisted_readmission_leaves_the_engine_held() -> None:
    service, store, fake = _service()
    assert (await service.drain(["e1"], wave=False, deadline_s=30))[0] == 200
    before = service.machine.records["e1"].model_copy()
    fake.engines["e1"].restart()
    store.broken = "[Errno 30] Read-only file system"
    status, doc = await service.readmit(["e1"], wave=False)
    assert status == 503 and "Read-only file system" in doc.error
    record = service.machine.records["e1"]
    assert record.state == before.state and record.old_process_start == before.old_process_start
    assert "e1" in service.core.scheduler.draining  # never readmitted without a durable record
    store.broken = ""
    status, doc = await service.readmit(["e1"], wave=False)
    assert status == 200, doc.error
    assert service.machine.state("e1") == "active" and store.writes[-1] == []


async def test_a_local_copy_failure_behind_a_written_shared_copy_does_not_stop_changes() -> None:
    service, store, _ = _service()
    # with a lease, a failed local state file is reported but the shared copy made the state durable
    service.core.persist_degraded = "state file /x/state.json not written: [Errno 28] No space left on device"
    status, doc = await service.drain(["e1"], wave=False, deadline_s=30)
    assert status == 200, doc.error
    assert store.writes == [["e1"]]  # straight to the change: no refusal round first
