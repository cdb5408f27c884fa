"""Warm standby (spec §2.6): shadow the primary, keep lease-validated snapshots, take over.

``judge_probe`` is the pure rule for one poll; ``StandbyLoop`` does the HTTP, the lease and the
state file. While shadowing, the standby's own in-memory state is untouched — only its state file
mirrors the primary. Every exit path on which the router is still standby releases the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from router.core import RouterCore
from router.ha import statefile
from router.ha.handoff import Handoff, HandoffError, HandoffVersionError, validate
from router.ha.lease import LeaseError, LeaseRecord
from router.ha.lease_backend import ControlLease, SharedHandoff
from router.ha.settings import HARuntime
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


def freshest(polled: Handoff | None, shared: Handoff | None, lease: LeaseRecord | None) -> Handoff | None:
    """The handoff to take over with: the polled snapshot, or the holder's shared copy when that is
    the last holder's own (same holder and epoch as the lease record) and newer than the poll."""
    if shared is None or lease is None or shared.holder != lease.holder or shared.epoch != lease.epoch:
        return polled
    if (
        polled is None
        or shared.epoch > polled.epoch
        or (shared.epoch == polled.epoch and shared.at > polled.at)
    ):
        return shared
    return polled


def fresher(polled: Handoff | None, stored: Handoff | None) -> Handoff | None:
    """Of two authentic documents (the poll and a fenced store's copy), the newer (epoch, at)."""
    if stored is None:
        return polled
    if polled is None or (stored.epoch, stored.at) > (polled.epoch, polled.at):
        return stored
    return polled


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
        lease: ControlLease,
        handover: Handover,
        activate: Callable[[ControlLease], Awaitable[str]],
        client: httpx.AsyncClient | None = None,
        shared: SharedHandoff | None = None,
    ) -> None:
        self.shared = shared  # the holder's shared handoff (file beside the lease, or etcd)
        self.core = core
        self.settings = settings
        self.lease = lease
        self.handover = handover  # applies the handoff at takeover (lifecycle + breaker)
        self.activate = activate  # starts renewal/persistence, validates identities; "" or why not
        self.primary = settings.standby_of.rstrip("/")
        self.client = client
        self.doc: Handoff | None = None
        self.misses = 0
        self.last_good_mono: float | None = None
        self.takeover_gap_s: float | None = None
        self.last_miss_reason = ""

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
            return ProbeResult(False, f"lease unreadable: {exc}")
        return judge_probe(status, body, h_body, record, self.core.clock.wall())

    async def _keep(self, doc: Handoff) -> None:
        if not newer_or_same(self.doc, doc):
            return
        self.doc = doc
        self.misses = 0
        self.last_good_mono = self.core.clock.monotonic()
        if self.core.control.failover_blocked == "no fresh handoff":
            self.core.control.failover_blocked = ""
        try:
            await asyncio.to_thread(statefile.write, self.settings.state_path, doc)
        except OSError as exc:
            log.warning("standby: cannot write %s: %s", self.settings.state_path, exc)

    async def run(self) -> None:
        """Shadow until takeover succeeds or is refused for good; always leaves a clean lease."""
        try:
            self.doc = statefile.load(self.settings.state_path)
        except HandoffError as exc:
            log.warning("standby: ignoring own state file: %s", exc)
        timeout = max(0.05, 0.8 * self.settings.standby_probe_interval_s)
        own_client = self.client is None
        client = self.client or httpx.AsyncClient(timeout=timeout, headers=control_headers(self.core))
        try:
            while True:
                result = await self.probe(client)
                if result.good and result.doc is not None:
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
        """One takeover attempt; True when the loop must end (took over, or refused for good)."""
        control, clock = self.core.control, self.core.clock
        fenced_store = self.lease.reclaims  # etcd: the stored copy is the holder's, by construction
        doc = self.doc if fenced_store else await self._freshest()
        self.doc = doc
        if not fenced_store and (
            doc is None or clock.wall() - doc.at > self.settings.standby_max_handoff_age_s
        ):
            control.failover_blocked = "no fresh handoff"
            return False
        try:
            claimed = await self.lease.claim()
        except LeaseError as exc:
            control.failover_blocked = f"{'etcd' if fenced_store else 'lease'} unavailable: {exc}"
            return False
        if not claimed:
            if fenced_store:  # a watch on the holder key: take over the moment it expires
                await self.lease.wait_vacant(self.settings.lease_ttl_s)
            return False  # another holder's unexpired lease: keep shadowing
        epoch = self.lease.epoch
        if fenced_store:
            try:
                stored = await self.shared.read() if self.shared is not None else None
            except (LeaseError, HandoffError) as exc:
                return await self._refuse(f"etcd handoff unusable: {exc}")
            doc = self.doc = fresher(self.doc, stored)
            if doc is None:
                return await self._refuse("no handoff: none polled and none stored in etcd")
            if doc.epoch >= epoch:
                return await self._refuse(f"handoff epoch {doc.epoch} cannot precede claimed epoch {epoch}")
        elif doc is None:
            return await self._refuse("no fresh handoff")
        elif doc.epoch != epoch - 1:
            return await self._refuse(f"handoff epoch {doc.epoch} cannot precede claimed epoch {epoch}")
        applied, why = self.handover.apply(doc)
        if not applied:
            return await self._refuse(why)
        if not self.lease.valid():
            return await self._refuse("lease expired while applying handoff")
        failure = await self.activate(self.lease)
        if failure:
            return await self._refuse(failure)
        self.takeover_gap_s = clock.monotonic() - (self.last_good_mono or clock.monotonic())
        log.warning(
            "TAKEOVER: claimed epoch %d after %d failed probes; applied run %s with %d roles; %.2fs since last good answer",
            epoch,
            self.misses,
            doc.run,
            len(doc.roles),
            self.takeover_gap_s,
        )
        return True

    async def _freshest(self) -> Handoff | None:
        """Before claiming: prefer the holder's shared handoff when it is newer than the last poll."""
        try:
            record = await self.lease.peek()
            shared = await self.shared.read() if self.shared is not None else None
        except (LeaseError, HandoffError, OSError) as exc:
            log.warning("standby: shared handoff unusable, keeping the polled one: %s", exc)
            return self.doc
        chosen = freshest(self.doc, shared, record)
        if chosen is not self.doc and chosen is not None:
            log.info("standby: taking over with the holder's shared handoff (at %.3f)", chosen.at)
        return chosen

    async def _refuse(self, why: str) -> bool:
        self.core.control.standby = True
        self.core.control.failover_blocked = why
        log.error("standby: takeover refused: %s", why)
        with contextlib.suppress(LeaseError):
            await self.lease.release()
        return True
