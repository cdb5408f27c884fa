"""The control machine's shell against the real file lease and shared handoff (fake clock)."""

from __future__ import annotations

from pathlib import Path

from router.clock import FakeClock
from router.ha import machine as m
from router.ha import statefile
from router.ha.handoff import Handoff
from router.ha.lease import Lease, LeaseSettings
from router.ha.lease_backend import FileLease
from router.ha.persist import FileHandoffStore
from router.ha.shell import ControlShell
from tests.unit.ha.helpers import core, handover

RULES = m.Rules(renew_every=1.0, retry_every=0.5)


class Router:
    """One router: a shell on its own ``FileLease`` of the shared lease path."""

    def __init__(self, tmp: Path, clock: FakeClock, name: str) -> None:
        self.lease = FileLease(
            Lease(
                LeaseSettings(path=str(tmp / "lease"), router_id=name, ttl_s=5.0),
                clock=clock,
                holder=f"{name}:1",
            )
        )
        self.store = FileHandoffStore(statefile.shared_handoff_path(str(tmp / "lease")))
        self.core = core(clock=clock)
        self.applied: list[Handoff] = []
        self.activated: list[int] = []
        self.shell = ControlShell(
            RULES,
            self.lease,
            self.store,
            clock,
            apply=self._apply,
            activate=self._activate,
            persist=self._persist,
        )

    def _apply(self, doc: Handoff, entry: m.Entry) -> tuple[bool, str]:
        self.applied.append(doc)
        return True, "applied"

    async def _activate(self, epoch: int) -> str:
        self.activated.append(epoch)
        return ""

    async def _persist(self) -> None:
        doc = (
            handover(self.core)
            .build()
            .model_copy(update={"epoch": self.lease.epoch, "holder": self.lease.holder})
        )
        await self.store.write(doc)


async def test_a_router_that_starts_alone_claims_epoch_one_and_writes_its_handoff(tmp_path: Path) -> None:
    a = Router(tmp_path, FakeClock(), "a")
    await a.shell.start()
    assert a.shell.state.phase is m.Phase.CONTROL and a.activated == [1] and a.applied == []
    found = await a.store.read()
    assert found.doc is not None and found.doc.epoch == 1 and found.doc.holder == "a:1"


async def test_a_held_lease_at_start_fences_once_its_holder_renews(tmp_path: Path) -> None:
    clock = FakeClock()
    a, b = Router(tmp_path, clock, "a"), Router(tmp_path, clock, "b")
    await a.shell.start()
    await b.shell.start()
    assert b.shell.state.phase is m.Phase.WAIT and b.shell.state.reason == m.HELD_ELSEWHERE
    clock.advance(1.0)
    await a.shell.tick()  # renewed: its holder is alive
    await b.shell.tick()
    fenced = b.shell.state  # (a new state object: the machine is pure)
    assert fenced.phase is m.Phase.FENCED and b.activated == []
    assert a.shell.state.controls(clock.monotonic())


async def test_an_unrenewed_lease_is_waited_out_and_taken_over_with_its_handoff(tmp_path: Path) -> None:
    clock = FakeClock()
    a, b = Router(tmp_path, clock, "a"), Router(tmp_path, clock, "b")
    await a.shell.start()
    await b.shell.start()
    clock.advance(6.0)  # a is frozen past its TTL
    await b.shell.tick()
    assert b.shell.state.controls(clock.monotonic()) and b.activated == [2]
    assert [d.epoch for d in b.applied] == [1]  # the holder's handoff, read after the claim
    await a.shell.tick()  # a thaws: its renewal finds the lease gone
    assert a.shell.state.phase is m.Phase.FENCED and a.shell.state.reason == m.RENEWAL_FAILED
    found = await b.store.read()
    assert found.doc is not None and found.doc.epoch == 2


async def test_a_change_is_acknowledged_after_the_write_and_refused_by_a_router_not_controlling(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    a, b = Router(tmp_path, clock, "a"), Router(tmp_path, clock, "b")
    await a.shell.start()
    await b.shell.start()
    await a.shell.feed(m.ChangeRequested(clock.monotonic(), 1))
    await b.shell.feed(m.ChangeRequested(clock.monotonic(), 2))
    assert a.shell.acked == [1] and [t for t, _ in b.shell.refused] == [2]
