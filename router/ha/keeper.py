"""Keeping the lease: claim at start, renewal with retries, re-claim after a local error (spec §3.3).

The peer fences a router for good at its first failed renewal, whatever the cause. Here only a
*real* loss is final (the record names another holder or epoch): an error reaching the store
(EMFILE, EINTR, a slow or full disk) is retried while the lease is still locally valid, and a
router that lost the lease only because of such an error claims it again once the error clears
(epoch above every epoch seen; a newer handoff written by someone else meanwhile is applied first).
A damaged lease record is waited out (it may still be a live holder's) and then claimed above every
epoch seen; the holder itself rewrites a damaged or vanished record at its next renewal.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

from router.clock import Clock, SystemClock
from router.ha import machine as m
from router.ha.control import ControlState
from router.ha.handoff import Handoff
from router.ha.lease import Lease, LeaseError, LeaseRecord, renewed_since
from router.ha.lease_backend import ControlLease, as_control_lease
from router.ha.shell import ActivateFn, ControlShell

log = logging.getLogger("narwhal.ha")
RENEWAL_FAILED = "lease renewal failed"
HELD_ELSEWHERE = "lease held by another router"


class LeaseKeeper:
    def __init__(
        self,
        lease: ControlLease | Lease,
        control: ControlState,
        renew_interval_s: float,
        epoch_floor: Callable[[], Awaitable[int]],
        on_claimed: Callable[[], Awaitable[str]],
        shell: Callable[[], ControlShell],
        start_shell: Callable[[ActivateFn], ControlShell],
        clock: Clock | None = None,
    ) -> None:
        self.lease = as_control_lease(lease)  # the file lease, or etcd (router/ha/lease_backend.py)
        self.control = control
        self.interval_s = renew_interval_s
        self.retry_s = max(0.01, renew_interval_s / 4)
        self.epoch_floor = epoch_floor  # highest epoch in the handoff documents we can read
        # after the start-up claim (``--resume``): "" or why control must not begin
        self.on_claimed = on_claimed
        # the control machine's shell (router/ha/shell.py): the RECLAIM and CONTEND entries
        self.shell = shell
        # the START entry's shell (no handoff read after the claim: ``--resume`` is the activation)
        self.start_shell = start_shell
        self._start_state: m.Control[Handoff] | None = None  # START: carried between attempts
        self.renewal_errors = 0
        self.reclaims = 0
        # etcd: a router that finds the lease held elsewhere keeps contending (a watch on the
        # holder key) instead of staying fenced for good (the file lease keeps the peer rule)
        self.contends = self.lease.contends  # ControlLease protocol member (file: False, etcd: True)
        self._recovered_logged = ""
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._held_at_start: LeaseRecord | None = None  # file lease: the record being waited out

    async def _floor(self) -> int:
        try:
            return await self.epoch_floor()
        except Exception as exc:  # unreadable documents: the lease's own memory still counts
            log.warning("cannot read handoff epochs before claiming: %s", exc)
            return 0

    async def _enter_start(self, immediate: bool) -> ControlShell:
        """One attempt of the ``START`` entry of the one takeover path (``router/ha/machine.py``):
        claim above every epoch seen, then Activate = ``on_claimed`` (``--resume``) + take control.
        The machine's state carries over between attempts (the record waited out at start)."""
        shell = self.start_shell(self._start_activate(immediate))
        prev = self._start_state
        base = prev if prev is not None else m.Control[Handoff](entry=m.Entry.START)
        await self._attempt(shell, replace(base, entry=m.Entry.START))
        self._start_state = shell.state
        return shell

    async def _attempt(self, shell: ControlShell, base: m.Control[Handoff]) -> None:
        """One attempt of an entry of the takeover path: the machine waits from ``base`` with the
        epoch floor read now, the shell runs the entry's effects; a recovered record is logged."""
        floor = await self._floor()
        shell.state = replace(base, phase=m.Phase.WAIT, seen=floor)
        await shell.enter(base.entry)
        if shell.claim_outcome == "claimed":
            self._note_recovery()

    def _start_activate(self, immediate: bool) -> ActivateFn:
        async def activate(_: int) -> str:
            if immediate:
                log.info("lease claimed: epoch %d holder %s", self.lease.epoch, self.lease.holder)
            why = await self.on_claimed()
            if why:
                return why
            self.control.take_control(self.lease)
            return ""

        return activate

    @staticmethod
    def _not_yet(shell: ControlShell) -> str:
        """Why a claim did not go through yet (/ready's reason): a damaged record waits for its
        holder."""
        reason = shell.state.reason
        if shell.claim_outcome == "damaged":
            return reason.replace(
                "lease record damaged: ", "lease record damaged, waiting for its holder: ", 1
            )
        return reason

    async def claim_at_start(self) -> bool | None:
        """The first claim (the machine's ``START`` entry). None: not yet — the caller runs
        ``claim_until_held`` in the background.

        File lease: a record held by another holder at start may be a process that is gone (both
        routers of a pair restarted within the TTL). It is waited out: claimed (epoch above every
        epoch seen) once it expires unrenewed; renewed or taken by someone meanwhile, its holder is
        alive and this router is fenced for good (the peer rule). etcd contends instead."""
        shell = await self._enter_start(immediate=True)
        state, outcome = shell.state, shell.claim_outcome
        if state.phase is m.Phase.CONTROL:
            return True
        if outcome == "held":
            record = shell.held
            if self.contends or record is None or state.phase is not m.Phase.WAIT:
                self._fence(HELD_ELSEWHERE)  # (etcd: the caller contends)
                return False
            self._held_at_start = record  # file lease: wait it out
            self._note_waiting(record)
        elif state.refusals:
            self._fence(state.reason)
            return False
        else:
            self.control.failover_blocked = self._not_yet(shell)
        self.control.standby = True  # not controlling until the claim goes through
        log.error("lease not claimed yet: %s (retrying)", self.control.failover_blocked)
        return None

    def _note_waiting(self, record: LeaseRecord) -> None:
        left = max(0.0, record.expires_at - self.clock.wall())
        self.control.failover_blocked = (
            f"{HELD_ELSEWHERE}: waiting for its lease to expire ({left:.1f}s left; "
            f"fenced for good if {record.holder} renews it)"
        )

    async def claim_until_held(self, previous_epoch: int) -> bool:
        """Retry the claim until it succeeds (True) or another holder owns the lease (False).
        ``previous_epoch`` > 0 (a re-claim after a store error) is the machine's RECLAIM entry;
        0 is its START entry, retried after the start-up claim did not go through at once."""
        if previous_epoch:
            return await self._reclaim(previous_epoch, self.shell)
        while True:
            await asyncio.sleep(self.retry_s)
            shell = await self._enter_start(immediate=False)
            state, outcome = shell.state, shell.claim_outcome
            if state.phase is m.Phase.CONTROL:
                # (a lease found held at start expired unrenewed, or the store answers again)
                log.warning("lease claimed: epoch %d", self.lease.epoch)
                return True
            first = self._held_at_start
            if outcome == "held":
                # still waiting out the record found held at start (unrenewed, or unreadable now)
                if (
                    first is not None
                    and not self.contends
                    and state.phase is m.Phase.WAIT
                    and not (shell.held is not None and renewed_since(first, shell.held))
                ):
                    self._note_waiting(first)
                    continue
                self._held_at_start = None  # renewed or taken: its holder or a successor is alive
                self._fence(HELD_ELSEWHERE)
                return await self.contend() if self.contends else False
            if state.refusals:
                self._fence(state.reason)
                return False
            self.control.failover_blocked = self._not_yet(shell)

    async def _reclaim(self, previous_epoch: int, make_shell: Callable[[], ControlShell]) -> bool:
        """The ``RECLAIM`` entry of the one takeover path (``router/ha/machine.py``): claim above
        every epoch seen, read the shared handoff after the claim, apply a newer one another holder
        wrote meanwhile, resume control. Retried until controlling (True) or refused (False)."""
        while True:
            await asyncio.sleep(self.retry_s)
            shell = make_shell()
            await self._attempt(shell, m.Control(entry=m.Entry.RECLAIM, previous=previous_epoch))
            state, outcome = shell.state, shell.claim_outcome
            if state.phase is m.Phase.CONTROL:
                log.warning("lease claimed again: epoch %d", self.lease.epoch)
                return True
            if outcome == "held":  # another live holder owns the lease
                self._fence(HELD_ELSEWHERE)
                return await self.contend() if self.contends else False
            if state.refusals:  # (etcd: the machine would contend again; the keeper stops here)
                self._fence(state.reason)
                return False
            if outcome == "claimed":  # the fresh lease ran out first (released): claim again
                self.control.failover_blocked = state.reason
                log.warning("claim interrupted, claiming again: %s", state.reason)
            elif outcome == "damaged":
                self.control.failover_blocked = self._not_yet(shell)
            else:
                self.control.failover_blocked = state.reason.replace(
                    "lease unavailable: ", "lease renewal failing: ", 1
                )

    async def contend(self) -> bool:
        """etcd: wait (a watch, not a poll) until the holder key vanishes, then claim and take
        over with the stored handoff (the machine's CONTEND entry). True once this router
        controls; False if refused for good."""
        return await self._contend(self.shell)

    async def _contend(self, make_shell: Callable[[], ControlShell]) -> bool:
        """The ``CONTEND`` entry of the one takeover path: on a vacant holder key, claim, read the
        stored handoff after the claim, adopt another holder's, take control."""
        while True:
            await self.lease.wait_vacant(max(1.0, 8 * self.interval_s))
            shell = make_shell()
            await self._attempt(shell, m.Control(entry=m.Entry.CONTEND))
            state, outcome = shell.state, shell.claim_outcome
            if state.phase is m.Phase.CONTROL:
                log.warning("lease taken over: epoch %d", self.lease.epoch)
                return True
            if outcome == "held":
                continue  # still held (or just re-claimed by someone else): keep watching
            if state.refusals:  # the machine released the lease
                self._fence(state.reason)
                return False
            if outcome == "claimed":  # the fresh lease ran out first (released): claim again
                self.control.failover_blocked = state.reason
                log.warning("claim interrupted, claiming again: %s", state.reason)
                continue
            self.control.failover_blocked = self._not_yet(shell)
            await asyncio.sleep(self.retry_s)

    def _fence(self, reason: str) -> None:
        self.control.fence(reason)
        log.error("router fenced: %s", reason)

    def _note_recovery(self) -> None:
        note = self.lease.recovered
        if note and note != self._recovered_logged:
            self._recovered_logged = note
            log.error("lease record recovered: %s", note)

    async def renew_forever(self) -> None:
        """Renew every interval; errors are retried within validity; a local loss re-claims."""
        lease = self.lease
        delay = self.interval_s
        while lease.owned:
            await asyncio.sleep(delay)
            if not lease.owned and not self.contends:
                return  # the file lease was released (shutdown)
            try:
                # lost between two renewals (etcd: a fenced write found the holder key deleted
                # or replaced) is the same loss as a failed renewal: fenced, and contending
                renewed = await lease.renew() if lease.owned else False
            except LeaseError as exc:
                self.renewal_errors += 1
                if lease.remaining() > 0:  # (not valid(): an unconfirmed etcd write is re-verified here)
                    log.warning("lease renewal error (retrying within validity): %s", exc)
                    delay = self.retry_s
                    continue
                epoch = lease.epoch
                self.control.failover_blocked = f"lease renewal failing: {exc}"
                log.error("lost the lease to a local error (epoch %d): %s; claiming again", epoch, exc)
                lease.owned = False
                self.reclaims += 1
                if await self.claim_until_held(epoch):
                    delay = self.interval_s
                    continue
                return
            if not renewed:
                self._fence(RENEWAL_FAILED)
                log.error("router fenced: lease renewal failed for epoch %d", lease.epoch)
                if self.contends and await self.contend():
                    delay = self.interval_s
                    continue
                return
            self._note_recovery()
            delay = self.interval_s
