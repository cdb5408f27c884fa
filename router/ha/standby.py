"""Warm standby (spec §2.6): shadow the primary, keep lease-validated snapshots, take over.

``judge_probe`` is the pure rule for one poll; ``StandbyLoop`` does the HTTP, the lease and the
state file. While shadowing, the standby's own in-memory state is untouched — only its state file
mirrors the primary. Every exit path on which the router is still standby releases the lease.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from router.core import RouterCore
from router.ha import machine as m
from router.ha import statefile
from router.ha.handoff import Handoff, HandoffError, HandoffVersionError, validate
from router.ha.lease import Lease, LeaseError, LeaseRecord
from router.ha.lease_backend import ControlLease, as_control_lease
from router.ha.persist import FileHandoffStore, HandoffStore
from router.ha.settings import HARuntime
from router.ha.shell import ControlShell
from router.ha.transfer import Handover

log = logging.getLogger("narwhal.ha.standby")


@dataclass(frozen=True)
class ProbeResult:
    good: bool
    reason: str = ""
    doc: Handoff | None = None


def primary_alive(status: int, body: Any) -> bool:
    """/ready 200, or 503 whose body says control_ready (maintenance or no engines still counts)."""
    if status == 200:
        return True
    return status == 503 and isinstance(body, dict) and body.get("control_ready") is True


def judge_probe(
    ready_status: int, ready_body: Any, handoff_body: Any, lease: LeaseRecord | None, now: float
) -> ProbeResult:
    """One poll's verdict. ``HandoffVersionError`` propagates (fatal: incompatible primary)."""
    if not primary_alive(ready_status, ready_body):
        return ProbeResult(False, f"primary /ready answered {ready_status}")
    try:
        doc = validate(handoff_body)
    except HandoffVersionError:
        raise
    except HandoffError as exc:
        return ProbeResult(False, f"primary handoff invalid: {exc}")
    if lease is None or lease.holder != doc.holder or lease.epoch != doc.epoch or lease.expires_at <= now:
        return ProbeResult(False, "primary handoff does not own the shared lease")
    return ProbeResult(True, "", doc)


def freshest(polled: Handoff | None, shared: Handoff | None) -> Handoff | None:
    """The handoff to take over with: the newest (epoch, then ``at``) of the polled snapshot and the
    holder's shared copy. The holder writes the shared copy before answering any lifecycle change,
    so it is never older than an acknowledged change; a corrupt or vanished lease record does not
    make it unusable."""
    if shared is None:
        return polled
    if polled is None or (shared.epoch, shared.at) > (polled.epoch, polled.at):
        return shared
    return polled


def takeover_handoff(
    polled: Handoff | None, durable: Handoff | None, now: float, max_age_s: float
) -> Handoff | None:
    """The handoff a takeover may use (None: "no fresh handoff").

    The freshness rule (``max_age_s``, ``ha.standby_max_handoff_age_s``) is for polled snapshots
    (and the standby's own mirror of one): an old poll may miss acknowledged changes. The durable
    copy (the shared file or etcd key) is written before every acknowledgement, so it is used
    however long ago it was written — a primary that could not write for a while (frozen, a
    read-only lease directory) acknowledged nothing meanwhile. With a durable copy the newest of
    the two is used (``freshest``)."""
    chosen = freshest(polled, durable)
    if chosen is None:
        return None
    if durable is None and now - chosen.at > max_age_s:
        return None
    return chosen


def control_headers(core: RouterCore) -> dict[str, str]:
    """The pair shares one fleet file: poll the primary with the fleet's control token, if any
    (with ``control.protect_reads`` the primary's /narwhal/handoff requires it)."""
    env = core.config.control.token_env
    token = os.environ.get(env, "") if env else ""
    return {"authorization": f"Bearer {token}"} if token else {}


def newer_or_same(kept: Handoff | None, doc: Handoff) -> bool:
    """Never replace a snapshot with one from an older epoch."""
    return kept is None or doc.epoch >= kept.epoch


class StandbyLoop:
    def __init__(
        self,
        core: RouterCore,
        settings: HARuntime,
        lease: ControlLease | Lease,
        handover: Handover,
        activate: Callable[[ControlLease], Awaitable[str]],
        client: httpx.AsyncClient | None = None,
        shared: HandoffStore | None = None,
    ) -> None:
        self.core = core
        self.settings = settings
        self.lease = as_control_lease(lease)  # file lease or etcd (router/ha/lease_backend.py)
        self.handover = handover  # applies the handoff at takeover (lifecycle + breaker)
        self.activate = activate  # starts renewal/persistence, validates identities; "" or why not
        self.primary = settings.standby_of.rstrip("/")
        self.client = client
        if shared is None and settings.lease_path:
            shared = FileHandoffStore(statefile.shared_handoff_path(settings.lease_path))
        self.shared = shared
        self.doc: Handoff | None = None
        self.misses = 0
        self.last_good_mono: float | None = None
        self.takeover_gap_s: float | None = None
        self.last_miss_reason = ""
        self.last_block_reason = ""  # the takeover block last logged (logged once per reason)
        self._shared_epoch = 0  # highest epoch seen in the shared handoff
        self._shared_damage = ""  # why the shared handoff was unusable at the last look
        self._shared: Handoff | None = None  # the shared handoff read after the last claim

    async def _get(self, client: httpx.AsyncClient, path: str) -> tuple[int, Any]:
        r = await client.get(self.primary + path)
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, None

    async def probe(self, client: httpx.AsyncClient) -> ProbeResult:
        try:
            status, body = await self._get(client, "/ready")
            if not primary_alive(status, body):
                return ProbeResult(False, f"primary /ready answered {status}")
            h_status, h_body = await self._get(client, "/narwhal/handoff")
        except httpx.HTTPError as exc:
            return ProbeResult(False, f"primary unreachable: {type(exc).__name__}")
        if h_status != 200:
            return ProbeResult(False, f"primary /narwhal/handoff answered {h_status}")
        try:
            record = await self.lease.peek()
        except LeaseError as exc:
            return ProbeResult(False, f"lease unreadable: {exc}")  # damage is remembered by the lease
        return judge_probe(status, body, h_body, record, self.core.clock.wall())

    async def _keep(self, doc: Handoff) -> None:
        if not newer_or_same(self.doc, doc):
            return
        self.doc = doc
        self.misses = 0
        self.last_good_mono = self.core.clock.monotonic()
        # a block set while shadowing (no fresh handoff, lease unavailable or damaged) is transient:
        # a good probe clears it (a refused takeover ends the loop instead)
        self.core.control.failover_blocked = ""
        try:
            await asyncio.to_thread(statefile.write, self.settings.state_path, doc)
        except OSError as exc:
            log.warning("standby: cannot write %s: %s", self.settings.state_path, exc)

    async def run(self) -> None:
        """Shadow until takeover succeeds or is refused for good; always leaves a clean lease."""
        own = await asyncio.to_thread(statefile.read, self.settings.state_path)
        self.doc = own.doc
        if own.kind not in ("ok", "missing"):
            log.warning("standby: ignoring own state file: %s", own.reason)
        timeout = max(0.05, 0.8 * self.settings.standby_probe_interval_s)
        own_client = self.client is None
        client = self.client or httpx.AsyncClient(timeout=timeout, headers=control_headers(self.core))
        try:
            while True:
                result = await self.probe(client)
                if result.good and result.doc is not None:
                    if self.last_miss_reason:  # INFO says what changed: the primary is back
                        log.info("standby: primary answers again after %d missed probes", self.misses)
                        self.last_miss_reason = ""
                    await self._keep(result.doc)
                else:
                    self.misses += 1
                    if result.reason != self.last_miss_reason:
                        log.info("standby: probe missed (%d): %s", self.misses, result.reason)
                        self.last_miss_reason = result.reason
                    if self.misses >= self.settings.standby_takeover_after:
                        done = await self.try_takeover()
                        if done:
                            return
                await asyncio.sleep(self.settings.standby_probe_interval_s)
        finally:
            if own_client:
                await client.aclose()
            if self.core.control.standby and self.lease.owned:
                await self.lease.release()

    async def try_takeover(self) -> bool:
        """One takeover attempt; True when the loop must end (took over, or refused for good).
        A takeover that cannot happen says why in the log, once per reason (``failover_blocked``
        is also on ``/ready``)."""
        done = await self._attempt_takeover()
        why = self.core.control.failover_blocked
        if not done and why and why != self.last_block_reason:
            log.warning("standby: takeover blocked: %s", why)
        self.last_block_reason = why
        return done

    async def _attempt_takeover(self) -> bool:
        """The ``STANDBY`` entry of the one takeover path (``router/ha/machine.py``, run by its
        shell): claim first, then read the shared handoff (the old holder is fenced by the claim,
        so no acknowledgement can land after that read), then apply the newest of it and the poll,
        then activate. True when the loop must end (took over, or refused for good)."""
        control, clock = self.core.control, self.core.clock
        if not await self._may_take_over():
            control.failover_blocked = m.NO_FRESH_HANDOFF
            return False
        shell = self._shell()
        shell.state = m.Control(
            phase=m.Phase.SHADOW, entry=m.Entry.STANDBY, polled=self.doc, seen=self._shared_epoch
        )
        await shell.enter(m.Entry.STANDBY)
        state = shell.state
        if shell.claim_outcome in ("held", "damaged"):  # another holder's unexpired lease
            if shell.claim_outcome == "damaged":  # waited out, in case its holder is alive
                control.failover_blocked = state.reason
            await self.lease.wait_vacant(self.settings.lease_ttl_s)  # etcd: a watch on the holder key
            return False  # keep shadowing
        if state.phase is m.Phase.CONTROL:
            self._took_over(state.epoch, clock.monotonic())
            return True
        if shell.claim_outcome == "claimed":  # the takeover itself did not go through
            if state.phase is m.Phase.FENCED:
                log.error("standby: takeover refused: %s", state.reason)
            else:  # the lease ran out during the takeover (a loaded host): the next miss claims again
                log.warning("standby: takeover interrupted, retrying: %s", state.reason)
        return state.phase is m.Phase.FENCED

    def _shell(self) -> ControlShell:
        settings = self.settings
        rules = m.Rules(
            standby=True,
            contends=self.lease.contends,
            takeover_after=settings.standby_takeover_after,
            probe_every=settings.standby_probe_interval_s,
            renew_every=settings.lease_renew_interval_s,
            retry_every=self._read_retry_s,
        )
        return ControlShell(
            rules,
            self.lease,
            self.shared,
            self.core.clock,
            apply=self._apply,
            activate=self._activate,
            persist=_written_by_activate,
            report=self._report,
            note=self._note_blocked,
            poll_fresh=self._poll_fresh,
            read_retry_s=self._read_retry_s,
        )

    def _poll_fresh(self, doc: Handoff) -> bool:
        now, max_age = self.core.clock.wall(), self.settings.standby_max_handoff_age_s
        return takeover_handoff(doc, None, now, max_age) is not None

    def _apply(self, doc: Handoff, _: m.Entry) -> tuple[bool, str]:
        """The machine's ``Apply``: the whole handoff (lifecycle + breaker)."""
        if doc is not self.doc:
            log.info("standby: taking over with the holder's shared handoff (at %.3f)", doc.at)
        self.doc = doc
        self._shared_epoch = max(self._shared_epoch, doc.epoch)
        return self.handover.apply(doc)

    async def _activate(self, epoch: int) -> str:
        if self.lease.recovered:
            log.error("standby: lease record recovered: %s", self.lease.recovered)
        return await self.activate(self.lease)

    def _report(self, report: m.Report) -> None:
        """Not controlling after a claim (refused, or the lease ran out): back to standby with
        the reason (the shell released the lease). A held lease changes nothing: shadowing."""
        if report.controlling or report.reason == "shadowing":
            return
        self.core.control.standby = True
        self.core.control.failover_blocked = report.reason

    def _took_over(self, epoch: int, now: float) -> None:
        doc = self.doc
        self.takeover_gap_s = now - (self.last_good_mono or now)
        log.warning(
            "TAKEOVER: claimed epoch %d after %d failed probes; applied run %s with %d roles; %.2fs since last good answer",
            epoch,
            self.misses,
            doc.run if doc is not None else "",
            len(doc.roles) if doc is not None else 0,
            self.takeover_gap_s,
        )

    async def _may_take_over(self) -> bool:
        """Before claiming: is there anything to take over with? (A fresh poll, or a shared copy
        that is there or cannot be read now; an unreadable one is read again after the claim.) This
        look only decides whether to claim and raises the claim's epoch floor; the state taken over
        with is read after the claim."""
        now, max_age = self.core.clock.wall(), self.settings.standby_max_handoff_age_s
        fresh_poll = takeover_handoff(self.doc, None, now, max_age) is not None
        if self.shared is None:
            return fresh_poll
        try:
            found = await self.shared.read()
        except OSError:
            return True
        except HandoffError:
            return fresh_poll
        if found.doc is not None:
            self._shared_epoch = max(self._shared_epoch, found.doc.epoch)
        return fresh_poll or found.kind in ("ok", "unreadable")

    def _note_blocked(self, why: str) -> None:
        self.core.control.failover_blocked = why  # still standby: not controlling while unreadable

    @property
    def _read_retry_s(self) -> float:
        return max(0.01, self.settings.lease_renew_interval_s / 4)


async def _written_by_activate() -> None:
    """``Persist`` after activation: ``HAService._activate`` already wrote the claimed epoch."""
