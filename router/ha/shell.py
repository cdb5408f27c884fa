"""The asyncio shell of the HA control machine (``router/ha/machine.py``): it only runs effects.

Each effect becomes one call on a collaborator — the ``ControlLease`` (claim / renew / release /
peek), the ``HandoffStore`` (read), and three typed callbacks given by the component: ``apply``
(the one apply call site: the whole handoff, or active-active's ``adopt``), ``activate`` (take
control: identity validation, loops; "" or why not) and ``persist`` (the fenced write). Its answer
is fed back to the machine as the next event, until no effect is left.

Not yet wired into ``HAService`` (which still runs ``keeper.py`` / ``standby.py``); exercised
against the real file lease in ``tests/unit/ha/test_shell.py``.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable

from router.clock import Clock
from router.ha import machine as m
from router.ha.handoff import Handoff
from router.ha.lease import LeaseError
from router.ha.lease_backend import ControlLease
from router.ha.persist import HandoffStore, PersistError

log = logging.getLogger("narwhal.ha")

ApplyFn = Callable[[Handoff, m.Entry], tuple[bool, str]]
ActivateFn = Callable[[int], Awaitable[str]]
PersistFn = Callable[[], Awaitable[None]]
ProbeFn = Callable[[], Awaitable[Handoff | None]]
READ_KINDS = {"ok": "ok", "missing": "missing", "unreadable": "unreadable"}  # anything else: damaged


class ControlShell:
    def __init__(
        self,
        rules: m.Rules,
        lease: ControlLease,
        store: HandoffStore,
        clock: Clock,
        *,
        apply: ApplyFn,
        activate: ActivateFn,
        persist: PersistFn,
        probe: ProbeFn | None = None,
        report: Callable[[m.Report], None] | None = None,
    ) -> None:
        self.rules = rules
        self.lease = lease
        self.store = store
        self.clock = clock
        self.apply = apply
        self.activate = activate
        self.persist = persist
        self.probe = probe
        self.report = report
        self.state: m.Control[Handoff] = m.Control()
        self.acked: list[int] = []
        self.refused: list[tuple[int, str]] = []

    def now(self) -> float:
        return self.clock.monotonic()

    async def feed(self, event: m.Event[Handoff]) -> None:
        """Step the machine and run every effect it asks for (answers are fed back in order)."""
        pending: deque[m.Event[Handoff]] = deque([event])
        while pending:
            self.state, effects = m.step(self.rules, self.state, pending.popleft())
            for effect in effects:
                answer = await self.run(effect)
                if answer is not None:
                    pending.append(answer)

    async def start(self) -> None:
        await self.feed(m.Started(self.now()))

    async def tick(self) -> None:
        await self.feed(m.Tick(self.now()))

    async def run(self, effect: m.Effect[Handoff]) -> m.Event[Handoff] | None:
        now = self.now
        if isinstance(effect, m.Claim):
            return await self._claim(effect.floor)
        if isinstance(effect, m.ReadHandoff):
            found = await self.store.read()
            return m.HandoffRead(now(), READ_KINDS.get(found.kind, "damaged"), found.doc)
        if isinstance(effect, m.Apply):
            applied, why = self.apply(effect.doc, effect.entry)
            return m.Applied(now(), applied, why)
        if isinstance(effect, m.Activate):
            why = await self.activate(effect.epoch)
            return m.Activated(now(), not why, why)
        if isinstance(effect, m.Renew):
            try:
                renewed = await self.lease.renew()
            except LeaseError as exc:
                return m.StoreFailed(now(), str(exc))
            return m.Renewed(now(), now() + self.lease.remaining()) if renewed else m.RenewLost(now())
        if isinstance(effect, m.Release):
            try:
                await self.lease.release()
            except LeaseError as exc:
                log.warning("lease release failed: %s", exc)
            return None
        if isinstance(effect, m.Persist):
            try:
                await self.persist()
            except PersistError:
                return m.Persisted(now(), False, effect.tokens)
            return m.Persisted(now(), True, effect.tokens)
        if isinstance(effect, m.Probe):
            doc = await self.probe() if self.probe is not None else None
            return m.Probed(now(), doc)
        if isinstance(effect, m.Ack):
            self.acked.extend(effect.tokens)
        elif isinstance(effect, m.Refuse):
            self.refused.extend((t, effect.reason) for t in effect.tokens)
        elif self.report is not None:
            self.report(effect)
        return None

    async def _claim(self, floor: int) -> m.Event[Handoff]:
        lease = self.lease
        try:
            claimed = await lease.claim(floor)
        except LeaseError as exc:
            return m.StoreFailed(self.now(), str(exc))
        if claimed:
            return m.Claimed(self.now(), lease.epoch, lease.previous_epoch, self.now() + lease.remaining())
        if lease.problem:  # a damaged record: waited out, in case its holder is alive
            return m.StoreFailed(self.now(), f"lease record damaged: {lease.problem}")
        try:
            record = await lease.peek()
        except LeaseError as exc:
            return m.StoreFailed(self.now(), str(exc))
        if record is None:  # vacant again since the claim: the next attempt claims it
            return m.StoreFailed(self.now(), "lease changed hands during the claim")
        return m.Held(self.now(), record.epoch, record.expires_at)
