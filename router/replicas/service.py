"""Active-active I/O: this replica's membership key, the watches, the drain acknowledgement wait.

Keys under the HA prefix (``docs/ha.md``, active-active; the layout is ``router/ha/etcd_keys.py``'s):

- ``<prefix>replicas/<replica-id>`` — ``narwhal.replica`` v1 (``member.py``) on this replica's own
  short etcd lease (``ha.replica_ttl_s``), kept alive every ttl/4. Updated when its content changes:
  at once for a new applied version or resident work on a held engine, coalesced otherwise
  (``rules.Coalescer``). If keep-alives fail, placement stops at ``rules.PlacementValidity``'s
  deadline, before etcd can expire the key.
- ``<prefix>handoff`` — the holder's committed state (written by the HA backend). Every replica
  watches it; a follower applies each newer revision to its placement (``follow.Follower``); the
  revision is the lifecycle *version*.
- ``<prefix>holder`` — the lease holder's key (HA backend); watched for the holder's replica id
  (the document's ``replicas.holder_url``); the HA backend's lease keeper contends for the lease
  when it disappears, and a takeover adopts the stored lifecycle only (``adopt``).

The holder's drain answers 200 only after ``acknowledge()``: every live replica's key reports the
committed version (or expired). Nothing here decides who controls the fleet: that is the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from router.core import RouterCore
from router.ha import transfer
from router.ha.etcd_client import EtcdClient, EtcdError, WatchEvent, op_range, prefix_end
from router.ha.etcd_keys import EtcdKeys, holder_router_id
from router.ha.handoff import Handoff, HandoffError, validate
from router.lifecycle.machine import LifecycleError
from router.lifecycle.service import LifecycleService
from router.replicas import rules
from router.replicas.follow import Follower
from router.replicas.member import MemberError, MemberRecord, decode_member
from router.replicas.picture import ReplicaSet
from router.tasks import Tasks

log = logging.getLogger("narwhal.replicas")
NOT_REGISTERED = "replica membership key not registered yet"
NOT_RENEWED = "replica membership key not renewed (etcd unreachable?)"
NO_STATE = "waiting for the holder's lifecycle state"


@dataclass(frozen=True)
class ReplicaSettings:
    prefix: str  # the HA prefix, ending in "/"
    replica_id: str
    control_url: str
    ttl_s: float = 2.0
    safety_margin_s: float = 0.5
    ack_timeout_s: float = 5.0
    tick_s: float = 0.05  # how often resident counts are compared for a membership update
    min_interval_s: float = 0.25  # coalescing of resident changes on serving engines

    @property
    def keys(self) -> EtcdKeys:
        return EtcdKeys(self.prefix)

    @property
    def members_prefix(self) -> bytes:
        return self.keys.replicas

    @property
    def member_key(self) -> bytes:
        return self.keys.replica(self.replica_id)

    @property
    def handoff_key(self) -> bytes:
        return self.keys.handoff

    @property
    def holder_key(self) -> bytes:
        return self.keys.holder


def replica_set(core: RouterCore, settings: ReplicaSettings) -> ReplicaSet:
    """This replica's picture of the set (built before the lifecycle, which reads it)."""
    return ReplicaSet(core.scheduler, core.clock, settings.replica_id, settings.control_url)


class ReplicaService:
    """The active-active component (``router.app.Component``)."""

    def __init__(
        self,
        core: RouterCore,
        lifecycle: LifecycleService,
        client: EtcdClient,
        settings: ReplicaSettings,
        readmit: Callable[[str], object] | None = None,
        *,
        replicas: ReplicaSet | None = None,
    ) -> None:
        self.core = core
        self.lifecycle = lifecycle
        self.client = client
        self.settings = settings
        # the lifecycle's picture (``replica_set`` → ``LifecycleService(replicas=...)``), or its own
        self.replicas = replicas if replicas is not None else replica_set(core, settings)
        self.follower = Follower(core, lifecycle.machine, readmit=readmit, holds=self.replicas.holds)
        self.validity = rules.PlacementValidity(settings.ttl_s, settings.safety_margin_s)
        self.coalescer = rules.Coalescer(settings.min_interval_s)
        self.lease_id = 0
        self.registered = False
        self.watch_errors = 0
        self.publishes = 0
        self._tasks = Tasks(log)
        self._waiters: set[asyncio.Future[None]] = set()
        self._signature: tuple[Any, ...] = ()

    # -- component protocol -----------------------------------------------------------------
    def add_routes(self, app: web.Application) -> None:
        return None

    async def start(self) -> None:
        self._spawn(self._keepalive_loop(), "narwhal-replica-keepalive")
        self._spawn(self._publish_loop(), "narwhal-replica-publish")
        self._spawn(self._watch_members(), "narwhal-replica-members")
        self._spawn(self._watch_state(), "narwhal-replica-state")

    async def stop(self) -> None:
        await self._tasks.stop()
        self.validity.lost()
        if self.lease_id:  # leave at once: drains stop waiting for us, our residents stop counting
            with contextlib.suppress(EtcdError):
                await self.client.lease_revoke(self.lease_id)
            self.lease_id = 0
        await self.client.aclose()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self._tasks.spawn(coro, name)

    # -- the placement gate (``router/replicas/mode.py``) -----------------------------------
    def placement_reason(self) -> str:
        if not self.validity.can_place(self.core.clock.monotonic()):
            return NOT_RENEWED if self.registered else NOT_REGISTERED
        if self.core.controls_fleet():
            return ""
        if self.follower.blocked:
            return self.follower.blocked
        if self.follower.version == 0:
            return NO_STATE
        return ""

    # -- membership key ---------------------------------------------------------------------
    async def _register(self) -> None:
        mono = self.core.clock.monotonic()
        lease_id = await self.client.lease_grant(math.ceil(self.settings.ttl_s))
        record = self.replicas.own_record()
        await self.client.put(self.settings.member_key, record.encode(), lease=lease_id)
        self.lease_id = lease_id
        self.validity.renewed(mono)
        self.registered = True
        self._published(record)
        log.info("replica %s registered (lease %x)", self.settings.replica_id, lease_id)

    async def _keepalive_loop(self) -> None:
        interval = self.settings.ttl_s / 4
        reported = ""
        while True:
            try:
                if not self.lease_id:
                    await self._register()
                else:
                    mono = self.core.clock.monotonic()
                    ttl = await self.client.lease_keepalive(self.lease_id)
                    if ttl > 0:
                        self.validity.renewed(mono)
                    else:  # etcd expired our key: stop placing now, register afresh
                        log.warning("replica key lease %x expired; registering again", self.lease_id)
                        self.validity.lost()
                        self.lease_id = 0
                        self.coalescer.published = None
                        continue
                reported = ""
            except EtcdError as exc:
                if str(exc) != reported:
                    log.warning("replica key renewal failed: %s", exc)
                    reported = str(exc)
            await asyncio.sleep(interval)

    def _published(self, record: MemberRecord) -> None:
        self.coalescer.mark_published(record, self.core.clock.monotonic())
        self.replicas.published(record)
        self.replicas.member_put(record)
        self.publishes += 1

    def _cheap_signature(self) -> tuple[Any, ...]:
        sched = self.core.scheduler
        return (
            self.replicas.reportable_version(),
            tuple((e.resident_prefill, e.resident_decode) for e in sched.engines.values()),
            tuple(sched.accepts_new(i) for i in sched.engines),
        )

    async def _publish_loop(self) -> None:
        tick = self.settings.tick_s
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(tick):
                    await self._wait_changed()
            if not self.lease_id:
                continue
            signature = self._cheap_signature()
            if signature == self._signature:
                continue
            record = self.replicas.own_record()
            due = self.coalescer.due(record, self.core.clock.monotonic(), self.replicas.not_accepting())
            if due is None:
                self._signature = signature
                continue
            if due > 0:
                continue  # the tick comes back for it
            try:
                await self.client.put(self.settings.member_key, record.encode(), lease=self.lease_id)
            except EtcdError as exc:
                log.warning("replica key update failed: %s", exc)
                continue
            self._signature = signature
            self._published(record)
            self._notify()

    # -- watches ------------------------------------------------------------------------------
    async def _list(self, key: bytes, range_end: bytes | None) -> tuple[int, list[Any]]:
        res = await self.client.txn([], [op_range(key, range_end)])
        kvs = res.ranges()[0] if res.ranges() else []
        return res.revision, kvs

    async def _watch_members(self) -> None:
        prefix = self.settings.members_prefix
        end = prefix_end(prefix)
        while True:
            try:
                revision, kvs = await self._list(prefix, end)
                live: dict[str, MemberRecord] = {}
                for kv in kvs:
                    record = self._member(kv.key, kv.value)
                    if record is not None:
                        live[record.replica_id] = record
                self.replicas.replace_members(live)
                self._notify()
                async for event in self.client.watch(prefix, start_revision=revision + 1, range_end=end):
                    self._member_event(event)
            except EtcdError as exc:
                self.watch_errors += 1
                log.debug("membership watch restarts: %s", exc)
            await asyncio.sleep(0.1)

    def _member(self, key: bytes, value: bytes) -> MemberRecord | None:
        rid = self.settings.keys.replica_id(key)
        try:
            return decode_member(value, key_id=rid)
        except MemberError as exc:
            log.warning("membership key %s refused: %s", key.decode(errors="replace"), exc)
            return None

    def _member_event(self, event: WatchEvent) -> None:
        rid = self.settings.keys.replica_id(event.kv.key)
        if event.type == "DELETE":
            self.replicas.member_gone(rid)  # our own: the keep-alive loop sees TTL 0 and re-registers
        else:
            record = self._member(event.kv.key, event.kv.value)
            if record is not None and rid != self.settings.replica_id:
                self.replicas.member_put(record)
        self._notify()

    async def _watch_state(self) -> None:
        """The holder key and the committed handoff: one listing, then one watch over both."""
        s = self.settings
        while True:
            try:
                res = await self.client.txn([], [op_range(s.holder_key), op_range(s.handoff_key)])
                holder, handoff = (kvs[0] if kvs else None for kvs in res.ranges())
                self._holder(holder.value if holder is not None else None)
                if handoff is not None:
                    self._state(handoff.mod_revision, handoff.value)
                end = s.keys.state_range_end  # both keys: [<prefix>handoff, <prefix>holder]
                async for event in self.client.watch(
                    s.handoff_key, start_revision=res.revision + 1, range_end=end
                ):
                    if event.kv.key == s.holder_key:
                        await self._holder_event(event)
                    elif event.kv.key == s.handoff_key and event.type == "PUT":
                        self._state(event.kv.mod_revision, event.kv.value)
            except EtcdError as exc:
                self.watch_errors += 1
                log.debug("state watch restarts: %s", exc)
            await asyncio.sleep(0.1)

    def _holder(self, raw: bytes | None) -> None:
        self.replicas.holder_id = holder_router_id(raw) if raw is not None else ""

    async def _holder_event(self, event: WatchEvent) -> None:
        self._holder(event.kv.value if event.type == "PUT" else None)

    def _state(self, revision: int, raw: bytes) -> None:
        try:
            doc = validate(orjson.loads(raw))
        except (orjson.JSONDecodeError, HandoffError) as exc:
            self.follower.blocked = f"cannot follow the holder's lifecycle state: {exc}"
            log.error("%s", self.follower.blocked)
            return
        if self.core.controls_fleet():  # our own commit coming back: it is the version we are at
            self.replicas.holds.observe(doc.lifecycle, revision)
            self.follower.version = max(self.follower.version, revision)
            self.follower.section = doc.lifecycle
        else:
            result = self.follower.apply(revision, doc)
            if not result.applied and self.follower.blocked:
                log.error("%s", self.follower.blocked)
        self.replicas.version = max(self.replicas.version, self.follower.version)
        self._notify()

    # -- takeover -----------------------------------------------------------------------------
    def adopt(self, doc: Handoff) -> tuple[bool, str]:
        """``ActiveActive.adopt`` after this replica claimed the lease: take over the lifecycle (a
        replacement's restore: ``validating`` becomes ``blocked``), never the dead holder's
        counters or breaker evidence — those stay per replica."""
        why = transfer.rejection(doc, self.core)
        if why:
            return False, why
        try:  # the machine's restore, not the service's: identities stay validated — this replica
            # served on them as a follower; the monitor's liveness sweep re-checks them as holder
            self.lifecycle.machine.restore(doc.lifecycle)
        except LifecycleError as exc:
            return False, f"handoff lifecycle rejected: {exc}"
        self.follower.section = doc.lifecycle
        log.warning(
            "replica %s takes control with the lifecycle of epoch %d", self.settings.replica_id, doc.epoch
        )
        self.core.journal.append(
            {"event": "replica_control", "action": "claimed", "at": self.core.clock.wall(),
             "replica_id": self.settings.replica_id, "previous_epoch": doc.epoch}
        )  # fmt: skip
        return True, f"lifecycle of epoch {doc.epoch} adopted (run {doc.run})"

    # -- acknowledgement (the holder's drain) ------------------------------------------------
    def _notify(self) -> None:
        for fut in list(self._waiters):
            if not fut.done():
                fut.set_result(None)
        self._waiters.clear()

    async def _wait_changed(self) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(fut)
        try:
            await fut
        finally:
            self._waiters.discard(fut)

    async def committed_version(self) -> int:
        kv = await self.client.get(self.settings.handoff_key)
        return kv.mod_revision if kv is not None else 0

    async def acknowledge(self) -> str:
        """ "" once every live replica applied the holder's last commit; else what is missing."""
        try:
            version = await self.committed_version()
        except EtcdError as exc:
            return f"cannot read the committed lifecycle version: {exc}"
        self.replicas.version = max(self.replicas.version, version)
        state = self.replicas.ack(version)
        try:
            async with asyncio.timeout(self.settings.ack_timeout_s):
                while not state.acknowledged:
                    await self._wait_changed()
                    state = self.replicas.ack(version)
        except TimeoutError:
            return state.describe()
        return ""

    # -- views --------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "mode": "active-active",
            "replica_id": self.settings.replica_id,
            "control_url": self.settings.control_url,
            "registered": self.registered,
            "can_place": self.validity.can_place(self.core.clock.monotonic()),
            "placement_reason": self.placement_reason(),
            "applied_version": self.replicas.version,
            "reported_version": self.replicas.reported,
            "holder_id": self.replicas.holder_id,
            "members": sorted(self.replicas.members),
            "publishes": self.publishes,
            "watch_errors": self.watch_errors,
        }
