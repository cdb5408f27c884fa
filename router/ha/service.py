"""The HA component: lease claim + renewal (fencing), state-file persistence, ``--resume``, warm
standby and ``GET /narwhal/handoff`` (spec §2.3–2.6, §3.3).

It is a ``router.app.Component``. Its collaborators are typed constructor arguments, wired by
``router/assemble.py``: the lifecycle (``transfer.LifecycleView``: snapshot / restore / wave hold),
the breaker (probe schedule of restored ejections) and the lifecycle monitor (``MonitorView``).
``persist()`` writes the state file now (assemble registers it as a lifecycle persist hook, so it
runs after every lifecycle change; a no-op on a standby or fenced router).

The periodic state-file write is the ``handoff`` stage of the lifecycle monitor pass when a monitor
runs (``monitor.add_stage``, spec §7.1: its failures count towards "monitoring degraded"); without a
monitor this component runs its own writer loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import shutil
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any, Protocol

import orjson
from aiohttp import web

from router.core import RouterCore
from router.ha import statefile
from router.ha.etcd_lease import EtcdKeyRefused
from router.ha.handoff import Handoff
from router.ha.lease import LeaseError
from router.ha.lease_backend import ControlLease, PersistError, SharedHandoff, build_backend
from router.ha.settings import HARuntime
from router.ha.standby import StandbyLoop
from router.ha.transfer import Handover, LifecycleView, ProbeSchedule

log = logging.getLogger("narwhal.ha")
RENEWAL_FAILED = "lease renewal failed"
ETCD_UNAVAILABLE = "etcd unavailable"

Stage = Callable[[], Awaitable[object]]


class MonitorView(Protocol):
    """What HA needs of the lifecycle monitor (``router.lifecycle.monitor.LifecycleMonitor``)."""

    def add_stage(self, name: str, stage: Stage) -> None: ...

    async def check_identities(self, engines: list[str] | None = None) -> None: ...


def resume_epoch_problem(doc: Handoff, claimed: int, fenced_store: bool = False) -> str:
    """With a lease, only the document of the epoch just before ours may be resumed. From a fenced
    store (etcd) any older epoch is fine too: no holder since could have written anything else."""
    if doc.epoch == claimed - 1 or (fenced_store and doc.epoch < claimed):
        return ""
    if doc.epoch < claimed - 1:
        return f"handoff epoch {doc.epoch} is older than the fleet's last lease epoch {claimed - 1}"
    return f"handoff epoch {doc.epoch} cannot precede claimed epoch {claimed}"


class HAService:
    def __init__(
        self,
        core: RouterCore,
        settings: HARuntime,
        lease: ControlLease | None = None,
        shared: SharedHandoff | None = None,
        *,
        lifecycle: LifecycleView | None = None,
        breaker: ProbeSchedule | None = None,
        monitor: MonitorView | None = None,
    ) -> None:
        self.core = core
        self.settings = settings
        self.lifecycle = lifecycle
        self.monitor = monitor
        self.handover = Handover(core, lifecycle, breaker)
        built_lease, built_shared, self.etcd_client = build_backend(settings, core.clock)
        self.lease: ControlLease | None = lease if lease is not None else built_lease
        self.shared: SharedHandoff | None = shared if shared is not None else built_shared
        core.control.lease = self.lease  # unowned until claimed: no control before start()
        self.standby_loop: StandbyLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._controlled_at_shutdown: bool | None = None
        self.resume_result: tuple[bool, str] | None = None
        self.takeover_gap_s: float | None = None
        self.persist_failures = 0
        self.monitored = False  # the monitor pass runs the periodic write (write_handoff)
        self._write_lock = asyncio.Lock()  # the final snapshot at stop() is never overtaken
        self._stopping = False

    # -- component protocol ----------------------------------------------------------------------
    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/narwhal/handoff", self.handoff_route)
        app.on_shutdown.append(self._on_shutdown)

    async def start(self) -> None:
        control = self.core.control
        if self.settings.standby_of:
            assert self.lease is not None  # HARuntime: --standby-of requires a lease
            control.standby = True
            self.standby_loop = StandbyLoop(
                self.core, self.settings, self.lease, self.handover, self._activate, shared=self.shared
            )
            self._spawn(self.standby_loop.run(), "narwhal-standby")
            log.info("standby of %s (lease %s)", self.settings.standby_of, self.lease.describe())
            return
        if self.lease is not None and not await self._claim_at_start(self.lease):
            if self.lease.reclaims:  # etcd: claim again once etcd answers and the holder key is free
                self._spawn(self._reclaim_loop(self.lease), "narwhal-lease-reclaim")
            return  # file lease: fenced, no resume, no renewal, never a second claim
        if self.settings.resume:
            await self.resume()
        self._start_loops()

    async def stop(self) -> None:
        controlled = self._controlled_at_shutdown
        if controlled is None:
            controlled = self.core.controls_fleet()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        self._stopping = True
        async with self._write_lock:  # a monitor-pass write still in flight lands first
            if controlled and self.core.controls_fleet():
                with contextlib.suppress(PersistError):
                    await self._persist_now()  # final snapshot with the latest counters
        if self.lease is not None and self.lease.owned:
            await self.lease.release()
        if self.etcd_client is not None:
            await self.etcd_client.aclose()

    async def _on_shutdown(self, _: web.Application) -> None:
        self._controlled_at_shutdown = self.core.controls_fleet()

    # -- lease -----------------------------------------------------------------------------------
    async def _claim_at_start(self, lease: ControlLease) -> bool:
        control = self.core.control
        try:
            claimed = await lease.claim()
        except EtcdKeyRefused as exc:
            control.fence(str(exc))
            log.error("router fenced: %s", exc)
            return False
        except LeaseError as exc:
            control.fence(f"{ETCD_UNAVAILABLE}: {exc}" if lease.reclaims else f"lease unavailable: {exc}")
            log.error("router fenced: %s", control.failover_blocked)
            return False
        if not claimed:
            control.fence("lease held by another router")
            log.error("router fenced: lease %s held by another router", lease.describe())
            return False
        log.info("lease claimed: epoch %d holder %s", lease.epoch, lease.holder)
        return True

    async def _renew_loop(self, lease: ControlLease) -> None:
        """Renew every interval. The file lease fences on the first failure (peer rule); etcd
        retries until the local validity runs out, so a leader election costs nothing."""
        interval = self.settings.lease_renew_interval_s
        while lease.owned:
            await asyncio.sleep(interval)
            if not lease.owned:
                break
            if await lease.renew():
                continue
            while lease.reclaims and lease.owned and lease.remaining() > 0:
                await asyncio.sleep(min(0.1, interval / 4))
                if await lease.renew():
                    break
            if lease.owned and lease.valid():
                continue
            self.core.control.fence(RENEWAL_FAILED if not lease.reclaims else self._etcd_reason(lease))
            log.error(
                "router fenced: lease renewal failed for epoch %d (%s)", lease.epoch, self._etcd_reason(lease)
            )
            break
        if lease.reclaims and not self._stopping:
            await lease.release()  # best effort: the next claim takes a new epoch
            await self._reclaim_loop(lease)

    @staticmethod
    def _etcd_reason(lease: ControlLease) -> str:
        why = getattr(lease, "last_error", "") or "lease lost"
        return f"{ETCD_UNAVAILABLE}: {why}" if "unavailable" in why else f"{RENEWAL_FAILED}: {why}"

    async def _reclaim_loop(self, lease: ControlLease) -> None:
        """etcd: claim again (epoch + 1) once etcd answers and nobody holds the lease, then take
        over with the handoff stored in etcd. Waits on a watch of the holder key, not a poll."""
        control = self.core.control
        interval = self.settings.lease_renew_interval_s
        while not self._stopping:
            try:
                claimed = await lease.claim()
            except EtcdKeyRefused as exc:
                control.fence(str(exc))
                await lease.wait_vacant(self.settings.lease_ttl_s)
                continue
            except LeaseError as exc:
                control.fence(f"{ETCD_UNAVAILABLE}: {exc}")
                await asyncio.sleep(interval)
                continue
            if not claimed:
                control.fence("lease held by another router")
                await lease.wait_vacant(self.settings.lease_ttl_s)
                continue
            why = await self._adopt_stored_handoff(lease)
            if why:
                control.fence(why)
                log.error("router fenced: %s", why)
                await lease.release()
                await lease.wait_vacant(self.settings.lease_ttl_s)
                continue
            control.take_control(lease)
            log.warning("lease claimed again: epoch %d holder %s", lease.epoch, lease.holder)
            self._start_loops()
            with contextlib.suppress(PersistError):
                await self._persist_now()
            return

    async def _adopt_stored_handoff(self, lease: ControlLease) -> str:
        """After a re-claim: apply the stored handoff unless it is this process's own (our memory
        is at least as fresh: nothing is acknowledged before it is stored). "" or why not."""
        if self.shared is None:
            return ""
        try:
            doc = await self.shared.read()
        except (LeaseError, ValueError) as exc:
            return f"stored handoff unusable: {exc}"
        if doc is None or doc.holder == lease.holder:
            return ""
        if doc.epoch >= lease.epoch:
            return f"handoff epoch {doc.epoch} cannot precede claimed epoch {lease.epoch}"
        applied, why = self.handover.apply(doc)
        return "" if applied else why

    # -- persistence -----------------------------------------------------------------------------
    async def persist(self) -> bool:
        """Make the live handoff durable now: the shared copy (file beside the lease, or the fenced
        etcd write), then ``recovery.state_path``. False when this router does not control the
        fleet; raises ``PersistError`` when the shared copy did not commit (no acknowledgement)."""
        if not self.core.controls_fleet():
            return False
        async with self._write_lock:
            await self._persist_now()
        return True

    async def _persist_now(self) -> None:
        try:
            doc = self.handover.build()
        except ValueError as exc:
            self.persist_failures += 1
            raise PersistError(f"handoff invalid: {exc}") from None
        if self.shared is not None:
            try:
                await self.shared.write(doc)
            except PersistError as exc:
                self.persist_failures += 1
                log.warning("%s", exc)
                raise
        try:
            await asyncio.to_thread(statefile.write, self.settings.state_path, doc)
        except (OSError, ValueError) as exc:
            self.persist_failures += 1
            log.warning("cannot write handoff %s: %s", self.settings.state_path, exc)
            if self.shared is None:
                raise PersistError(f"state file {self.settings.state_path} not written: {exc}") from None

    async def write_handoff(self) -> None:
        """The periodic write (monitor stage ``handoff``); raises when the state cannot be written."""
        async with self._write_lock:
            if self._stopping or not self.core.controls_fleet():
                return
            await self._persist_now()

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.persist_interval_s)
            with contextlib.suppress(PersistError):
                await self.write_handoff()

    async def resume(self) -> tuple[bool, str]:
        """``--resume``: apply the state file (etcd backend: the handoff stored in etcd, the local
        file only when etcd holds none), all or nothing; a refusal is logged with its reason."""
        path = Path(self.settings.state_path)
        doc, why = await asyncio.to_thread(statefile.load_reason, path)
        from_etcd = self.etcd_client is not None and self.shared is not None
        if from_etcd and self.shared is not None:
            try:
                stored = await self.shared.read()
            except (LeaseError, ValueError) as exc:
                stored, doc, why = None, None, f"etcd handoff unusable: {exc}"
            if stored is not None:
                doc, why = stored, ""
        if doc is not None and self.lease is not None and self.lease.owned:
            why = resume_epoch_problem(doc, self.lease.epoch, fenced_store=from_etcd)
        applied = False
        if not why:
            applied, why = self.handover.apply(doc)
        self.resume_result = (applied, why)
        if applied:
            log.info("%s", why)
            return applied, why
        log.warning("handoff not applied (%s): %s", path, why)
        self._keep_rejected(path)
        if self.core.config.engine_contract is not None and await asyncio.to_thread(path.exists):
            self._restart_wave(f"handoff rejected: {why}")
        return applied, why

    @staticmethod
    def _keep_rejected(path: Path) -> None:
        """The next periodic write replaces the refused file: keep a copy as evidence."""
        if not path.exists():
            return
        try:
            shutil.copyfile(path, path.with_name(path.name + ".rejected"))
        except OSError as exc:
            log.warning("cannot keep a copy of the refused handoff %s: %s", path, exc)

    def _restart_wave(self, reason: str) -> None:
        if self.lifecycle is not None:
            self.lifecycle.require_restart_wave(reason)
        else:  # no lifecycle machine attached: still hold the whole fleet, fail closed
            self.core.scheduler.fleet_hold = f"whole-wave restart required: {reason}"

    # -- takeover (called by the standby loop once the lease is ours and the handoff applied) ----
    async def _activate(self, lease: ControlLease) -> str:
        core = self.core
        core.control.take_control(lease)
        if self.monitor is not None:
            core.identities_ready = False
            try:
                await self.monitor.check_identities()
            except Exception as exc:
                log.warning("identity validation after takeover failed: %s: %s", type(exc).__name__, exc)
        elif core.config.engine_contract is not None:
            core.identities_ready = False  # pending: the lifecycle monitor validates the identities
        if not lease.valid():
            core.control.standby = True
            return "lease expired during identity validation"
        self._start_loops()
        loop = self.standby_loop
        if loop is not None and loop.last_good_mono is not None:
            self.takeover_gap_s = core.clock.monotonic() - loop.last_good_mono
        with contextlib.suppress(PersistError):
            await self.persist()
        return ""

    def _start_loops(self) -> None:
        if self.lease is not None and self.lease.owned:
            self._spawn(self._renew_loop(self.lease), "narwhal-lease-renewal")
        if self.monitor is not None:  # after claim/resume/takeover: never overwrite an unread file
            self.monitor.add_stage("handoff", self.write_handoff)
            self.monitored = True
        else:
            self._spawn(self._persist_loop(), "narwhal-handoff-writer")

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        task.add_done_callback(_log_crash)
        self._tasks.append(task)

    # -- views -----------------------------------------------------------------------------------
    async def handoff_route(self, _: web.Request) -> web.Response:
        try:
            body = orjson.dumps(self.handover.build().dump())
        except ValueError as exc:  # our own state fails validation: say so, publish nothing
            err = {"error": {"message": f"handoff unavailable: {exc}", "type": "internal"}}
            return web.Response(status=500, body=orjson.dumps(err), content_type="application/json")
        return web.Response(body=body, content_type="application/json")

    def state(self) -> dict[str, Any]:
        """The ``ha`` section of ``/narwhal/state``."""
        control, lease, loop = self.core.control, self.lease, self.standby_loop
        return {
            "controls_fleet": self.core.controls_fleet(),
            "standby": control.standby,
            "fenced": control.fenced(),
            "blocked": control.failover_blocked,
            "epoch": control.epoch,
            "holder": control.holder,
            "lease_path": self.settings.lease_path,
            "lease_backend": "etcd" if self.settings.etcd_endpoints else ("file" if self.lease else ""),
            "lease": self.lease.describe() if self.lease is not None else "",
            "lease_valid": lease.valid() if lease is not None else None,
            "lease_remaining_s": round(lease.remaining(), 3) if lease is not None else None,
            "standby_of": self.settings.standby_of,
            "failed_probes": loop.misses if loop is not None else 0,
            "takeover_gap_s": self.takeover_gap_s,
            "state_path": self.settings.state_path,
            "persist_failures": self.persist_failures,
        }

    def metric_lines(self) -> Iterable[str]:
        gap = self.takeover_gap_s
        return [
            "# HELP narwhal_takeover_seconds Seconds from the standby's last good probe to serving (0: none).",
            "# TYPE narwhal_takeover_seconds gauge",
            f"narwhal_takeover_seconds {gap if gap is not None and math.isfinite(gap) else 0.0}",
            "# HELP narwhal_router_fenced 1 while this router is fenced (lost or never got the lease).",
            "# TYPE narwhal_router_fenced gauge",
            f"narwhal_router_fenced {int(self.core.control.fenced())}",
            "# HELP narwhal_router_standby 1 while this router shadows a primary.",
            "# TYPE narwhal_router_standby gauge",
            f"narwhal_router_standby {int(self.core.control.standby and not self.core.control.failover_blocked)}",
        ]


def _log_crash(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.error("%s crashed: %s: %s", task.get_name(), type(exc).__name__, exc, exc_info=exc)
