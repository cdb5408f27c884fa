"""The asyncio shell of the HA control machine (``router/ha/machine.py``): it only runs effects.

Each effect becomes one call on a collaborator — the ``ControlLease`` (claim / renew / release /
peek), the ``HandoffStore`` (read), and three typed callbacks given by the component: ``apply``
(the one apply call site: the whole handoff, or active-active's ``adopt``), ``activate`` (take
control: identity validation, loops; "" or why not) and ``persist`` (the fenced write). Its answer
is fed back to the machine as the next event, until no effect is left.

The lease object is the authority on validity during a takeover: the ``now`` of each answer
fed back between the claim and activation is placed on the right side of the machine's
``valid_until`` by ``lease.valid()`` (the two clocks never disagree about a deadline). The handoff
is read with ``read_after_claim`` (read again, with backoff, while unreadable, as long as the fresh
lease is valid).

All four entries gain control through this shell: ``STANDBY`` (``StandbyLoop._attempt_takeover``),
``START`` (``LeaseKeeper.claim_at_start`` / ``claim_until_held(0)``, with ``HAService._start_shell``),
``RECLAIM`` and ``CONTEND`` (``LeaseKeeper._reclaim`` / ``_contend``, with
``HAService._control_shell``) (docs/architecture.md, "The path of a takeover"). Exercised against the real file lease in ``tests/unit/ha/test_shell.py``.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable

from router.clock import Clock
from router.ha import machine as m
from router.ha.handoff import Handoff
from router.ha.lease import LeaseError, LeaseRecord
from router.ha.lease_backend import ControlLease
from router.ha.persist import HandoffStore, PersistError, read_after_claim

log = logging.getLogger("narwhal.ha")

ApplyFn = Callable[[Handoff, m.Entry], tuple[bool, str]]
ActivateFn = Callable[[int], Awaitable[str]]
PersistFn = Callable[[], Awaitable[None]]
ProbeFn = Callable[[], Awaitable[Handoff | None]]
TAKING_OVER = (m.Phase.READ, m.Phase.APPLY, m.Phase.ACTIVATE)
READ_KINDS = {"ok": "ok", "missing": "missing", "unreadable": "unreadable"}  # anything else: damaged


class ControlShell:
    def __init__(
        self,
        rules: m.Rules,
        lease: ControlLease,
        store: HandoffStore | None,
        clock: Clock,
        *,
        apply: ApplyFn,
        activate: ActivateFn,
        persist: PersistFn,
        probe: ProbeFn | None = None,
        report: Callable[[m.Report], None] | None = None,
        note: Callable[[str], None] | None = None,
        poll_fresh: Callable[[Handoff], bool] | None = None,
        read_retry_s: float = 0.01,
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
        self.note = note  # why the handoff cannot be read yet (while reading it again)
        self.poll_fresh = poll_fresh  # standby: may its polled snapshot be used without a durable copy
        self.read_retry_s = read_retry_s
        self.claim_outcome = ""  # the last claim: "claimed" | "held" | "damaged" | "error"
        self.held: LeaseRecord | None = None  # the record a "held" claim found (None: unreadable/vacant)
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

    async def enter(self, entry: m.Entry) -> None:
        await self.feed(m.Enter(self.now(), entry))

    def _takeover_now(self) -> float:
        """``now`` for an answer during a takeover, on the side of ``valid_until`` the lease says."""
        now, until = self.now(), self.state.valid_until
        if self.state.phase not in TAKING_OVER:
            return now
        if self.lease.valid():
            return min(now, math.nextafter(until, -math.inf))
        return max(now, until)

    async def run(self, effect: m.Effect[Handoff]) -> m.Event[Handoff] | None:
        now = self.now
        if isinstance(effect, m.Claim):
            return await self._claim(effect.floor)
        if isinstance(effect, m.ReadHandoff):
            return await self._read()
        if isinstance(effect, m.Apply):
            applied, why = self.apply(effect.doc, effect.entry)
            return m.Applied(self._takeover_now(), applied, why)
        if isinstance(effect, m.Activate):
            why = await self.activate(effect.epoch)
            return m.Activated(self._takeover_now(), not why, why)
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

    async def _read(self) -> m.Event[Handoff]:
        """The durable handoff after the claim (read again while unreadable: ``read_after_claim``)."""
        fresh = self.poll_fresh
        polled = self.state.polled
        poll_fresh = fresh is None or polled is None or fresh(polled)
        if self.store is None:  # no durable copy configured: the poll alone (the peer's rule)
            return m.HandoffRead(self._takeover_now(), "missing", None, "", poll_fresh)
        note = self.note if self.note is not None else (lambda _: None)
        found = await read_after_claim(self.store, self.lease, note, self.read_retry_s)
        if found is None:  # the fresh lease ran out while the copy stayed unreadable
            return m.HandoffRead(max(self.now(), self.state.valid_until), "unreadable")
        if fresh is not None and polled is not None:
            poll_fresh = fresh(polled)  # (the read may have taken a while)
        kind = READ_KINDS.get(found.kind, "damaged")
        return m.HandoffRead(self._takeover_now(), kind, found.doc, found.reason, poll_fresh)

    async def _claim(self, floor: int) -> m.Event[Handoff]:
        lease = self.lease
        self.claim_outcome = "error"
        self.held = None
        try:
            claimed = await lease.claim(floor)
        except LeaseError as exc:
            return m.StoreFailed(self.now(), f"lease unavailable: {exc}")
        if claimed:
            self.claim_outcome = "claimed"
            now = self.now()
            return m.Claimed(now, lease.epoch, lease.previous_epoch, now + lease.remaining())
        if lease.problem:  # a damaged record: waited out, in case its holder is alive
            self.claim_outcome = "damaged"
            return m.StoreFailed(self.now(), f"lease record damaged: {lease.problem}")
        self.claim_outcome = "held"
        try:
            record = await lease.peek()
        except LeaseError as exc:
            return m.StoreFailed(self.now(), f"lease unavailable: {exc}")
        if record is None:  # vacant again since the claim: the next attempt claims it
            return m.StoreFailed(self.now(), "lease changed hands during the claim")
        self.held = record
        return m.Held(self.now(), record.epoch, record.expires_at)
