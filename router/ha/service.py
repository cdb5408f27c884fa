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
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import orjson
from aiohttp import web

from router.control_mode import ControlMode
from router.core import RouterCore
from router.ha import machine as m
from router.ha import statefile
from router.ha.handoff import Handoff
from router.ha.keeper import RENEWAL_FAILED, LeaseKeeper
from router.ha.lease import Lease
from router.ha.lease_backend import ControlLease, as_control_lease, build_backend
from router.ha.persist import HandoffStore, Persister, PersistError
from router.ha.settings import HARuntime
from router.ha.shell import ActivateFn, ControlShell
from router.ha.standby import StandbyLoop
from router.ha.transfer import Handover, LifecycleView, ProbeSchedule
from router.tasks import Tasks

log = logging.getLogger("narwhal.ha")
__all__ = ["RENEWAL_FAILED", "HAService", "choose_resume"]

Stage = Callable[[], Awaitable[object]]


class MonitorView(Protocol):
    """What HA needs of the lifecycle monitor (``router.lifecycle.monitor.LifecycleMonitor``)."""

    def add_stage(self, name: str, stage: Stage) -> None: ...

    async def check_identities(self, engines: list[str] | None = None) -> None: ...


def _newer(a: Handoff, b: Handoff) -> bool:
    return (a.epoch, a.at) > (b.epoch, b.at)


def choose_resume(
    local: statefile.StateRead,
    shared: statefile.StateRead | None,
    lease_epoch: int = 0,
    names: tuple[str, str] = ("state file", "shared handoff"),
) -> tuple[Handoff | None, str, str]:
    """The document ``--resume`` applies: (doc, "", where) or (None, why not, "").

    The newest valid document (epoch, then ``at``) among the local state file and the shared
    handoff, whichever router wrote it. A damaged copy (torn, empty, symlink, invalid) is only
    passed over when the document chosen instead belongs to the fleet's last lease epoch: otherwise
    the damaged copy may have held newer acknowledged state, and nothing is applied.
    """
    found = [(r, w) for r, w in ((local, names[0]), (shared, names[1])) if r is not None]
    valid = [(r.doc, w) for r, w in found if r.doc is not None]
    damaged = [r.reason for r, _ in found if r.kind not in ("ok", "missing")]
    if not valid:
        reasons = damaged or [local.reason]
        return None, "; ".join(reasons), ""
    doc, where = valid[0]
    for other, other_where in valid[1:]:
        if _newer(other, doc):
            doc, where = other, other_where
    if damaged and doc.epoch < lease_epoch:
        return (
            None,
            f"{'; '.join(damaged)}; the newest valid handoff (epoch {doc.epoch}) is older than the lease's last epoch {lease_epoch}",
            "",
        )
    return doc, "", where


def _keep_rejected(path: Path) -> None:
    """The next write replaces the refused file: keep a copy as evidence (never via a symlink)."""
    raw, kind, detail = statefile.read_raw(path)
    if raw is None:
        if kind == "symlink":
            log.warning("refused state file not copied: %s", detail)
        return
    try:
        statefile.write_bytes(path.with_name(path.name + ".rejected"), raw)
    except OSError as exc:
        log.warning("cannot keep a copy of the refused handoff %s: %s", path, exc)


class HAService:
    def __init__(
        self,
        core: RouterCore,
        settings: HARuntime,
        lease: ControlLease | Lease | None = None,
        shared: HandoffStore | None = None,
        *,
        lifecycle: LifecycleView | None = None,
        breaker: ProbeSchedule | None = None,
        monitor: MonitorView | None = None,
        mode: ControlMode | None = None,
    ) -> None:
        self.core = core
        self.settings = settings
        self.lifecycle = lifecycle
        self.monitor = monitor
        self.handover = Handover(core, lifecycle, breaker)
        # what a claim after another holder takes of its handoff (router/control_mode.py):
        # active-passive the whole handoff, active-active the lifecycle only
        self.mode: ControlMode = mode if mode is not None else core.mode
        # the configured backend (router/ha/lease_backend.py): file lease, etcd, or none
        built_lease, built_shared, self.etcd_client = build_backend(settings, core.clock)
        self.lease: ControlLease | None = as_control_lease(lease) if lease is not None else built_lease
        core.control.lease = self.lease  # unowned until claimed: no control before start()
        self.keeper = (
            LeaseKeeper(
                self.lease,
                core.control,
                settings.lease_renew_interval_s,
                self._epoch_floor,
                self._claimed,
                shell=self._control_shell,
                start_shell=self._start_shell,
                clock=core.clock,
            )
            if self.lease is not None
            else None
        )
        self.standby_loop: StandbyLoop | None = None
        self._tasks = Tasks(log)  # renewal, writer, standby / claim / contend loops
        self._controlled_at_shutdown: bool | None = None
        self.resume_result: tuple[bool, str] | None = None
        self.takeover_gap_s: float | None = None
        if shared is None:
            shared = built_shared
        self.shared = shared  # where a successor finds our state (written first)
        self.persister = Persister(
            self.handover.build,
            settings.state_path,
            shared,
            on_change=self._degraded,
            monotonic=core.clock.monotonic,
        )
        self.monitored = False  # the monitor pass runs the periodic write (write_handoff)
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
            self._tasks.spawn(self.standby_loop.run(), "narwhal-standby")
            log.info("standby of %s (lease %s)", self.settings.standby_of, self.lease.describe())
            return
        if self.keeper is not None:
            claimed = await self.keeper.claim_at_start()
            if claimed is False:  # held by another router: fenced (file lease: for good)
                if self.keeper.contends:  # etcd: claim when the holder key vanishes
                    self._tasks.spawn(self._contend_later(), "narwhal-lease-contend")
                return
            if claimed is None:  # store unreachable or record damaged: claim in the background
                self._tasks.spawn(self._claim_later(), "narwhal-lease-claim")
                return
        else:
            await self._claimed()
        await self._controlling()

    async def _claim_later(self) -> None:
        assert self.keeper is not None
        if await self.keeper.claim_until_held(0):
            await self._controlling()

    async def _contend_later(self) -> None:
        assert self.keeper is not None
        if await self.keeper.contend():
            await self._controlling()

    async def _controlling(self) -> None:
        """Control begins: the claimed epoch is written at once (shared copy and this router's own
        state file, the epoch floor that survives a deleted lease directory), then the loops."""
        await self.write_handoff()
        self._start_loops()

    async def _claimed(self) -> str:
        """The start-up claim's activation (the machine's ``START`` entry, run by the keeper):
        ``--resume`` applies the newest valid document (``choose_resume`` over the local state file
        and the shared copy); without it nothing is applied. A re-claim and an etcd contender's
        claim adopt through ``_control_shell`` instead."""
        if self.settings.resume:
            await self.resume()
        return ""

    def _control_shell(self) -> ControlShell:
        """The control machine's shell for this router's lease (re-claim after a store error, etcd
        contender)."""
        return self._shell(self.shared, self._resume_control)

    def _start_shell(self, activate: ActivateFn) -> ControlShell:
        """The ``START`` entry's shell: no handoff read after the claim (``--resume`` reads the
        local state file and the shared copy itself, in ``activate``)."""
        return self._shell(None, activate)

    def _shell(self, store: HandoffStore | None, activate: ActivateFn) -> ControlShell:
        assert self.lease is not None
        settings = self.settings
        rules = m.Rules(
            contends=self.lease.contends,
            renew_every=settings.lease_renew_interval_s,
            retry_every=self._read_retry_s,
        )
        return ControlShell(
            rules,
            self.lease,
            store,
            self.core.clock,
            apply=self._adopt,
            activate=activate,
            persist=_nothing_to_write,
            note=self._note_blocked,
            read_retry_s=self._read_retry_s,
        )

    def _adopt(self, doc: Handoff, entry: m.Entry) -> tuple[bool, str]:
        """The machine's ``Apply`` after a re-claim or a contender's claim: what the mode takes of
        the handoff another holder wrote (a contender's own last handoff: nothing to take)."""
        assert self.lease is not None
        if entry is m.Entry.CONTEND and doc.holder == self.lease.holder:
            return True, ""
        applied, why = self.mode.adopt(doc, self.handover.apply)
        if not applied:
            return False, f"lease claimed again, but the newer handoff was not applied: {why}"
        log.warning("lease claimed again: %s", why)
        return True, ""

    async def _resume_control(self, _: int) -> str:
        """The machine's ``Activate`` after a re-claim or a contender's claim: control (the caller
        starts or keeps the loops)."""
        assert self.lease is not None
        self.core.control.take_control(self.lease)
        return ""

    def _note_blocked(self, why: str) -> None:
        self.core.control.failover_blocked = why  # not controlling while it cannot read

    @property
    def _read_retry_s(self) -> float:
        return max(0.01, self.settings.lease_renew_interval_s / 4)

    async def _epoch_floor(self) -> int:
        """The highest epoch in the handoff documents this router can read (local + shared)."""
        local = await asyncio.to_thread(statefile.read, self.settings.state_path)
        shared = await self.shared.read() if self.shared is not None else None
        docs = [r.doc for r in (local, shared) if r is not None and r.doc is not None]
        loop = self.standby_loop
        if loop is not None and loop.doc is not None:
            docs.append(loop.doc)
        return max((d.epoch for d in docs), default=0)

    async def stop(self) -> None:
        controlled = self._controlled_at_shutdown
        if controlled is None:
            controlled = self.core.controls_fleet()
        await self._tasks.stop()
        self._stopping = True
        if controlled and self.core.controls_fleet():  # final snapshot with the latest counters
            with contextlib.suppress(PersistError):  # (after any write in flight: one lock)
                await self.persister.persist()
        if self.lease is not None and self.lease.owned:
            await self.lease.release()
        if self.etcd_client is not None:
            await self.etcd_client.aclose()

    async def _on_shutdown(self, _: web.Application) -> None:
        self._controlled_at_shutdown = self.core.controls_fleet()

    # -- persistence (router/ha/persist.py) ------------------------------------------------------
    @property
    def persist_failures(self) -> int:
        return self.persister.failures

    def _degraded(self, reason: str) -> None:
        self.core.persist_degraded = reason

    async def persist(self) -> bool:
        """Make the live handoff durable now (shared copy first, then ``recovery.state_path``).

        False (nothing written) unless this router controls the fleet; raises ``PersistError``
        when the state is not where a successor would find it. The lifecycle awaits this before
        answering any mutation.
        """
        if not self.core.controls_fleet():
            return False
        await self.persister.persist()
        return True

    async def write_handoff(self) -> None:
        """The periodic write (monitor stage ``handoff``; skipped while only ``at`` and the counters
        changed, for up to ``persist.REFRESH_S``). A failure degrades the *control* plane
        (``core.persist_degraded``: mutations refused, /ready and /metrics say why), never serving,
        so it is not raised into the monitor's health."""
        if self._stopping or not self.core.controls_fleet():
            return
        with contextlib.suppress(PersistError):
            await self.persister.persist(periodic=True)

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.persist_interval_s)
            await self.write_handoff()

    async def resume(self) -> tuple[bool, str]:
        """``--resume``: apply the newest valid document among the local state file and the shared
        handoff, all or nothing; a refusal is logged with its reason (and kept as ``.rejected``)."""
        local_path = Path(self.settings.state_path)
        local = await asyncio.to_thread(statefile.read, local_path)
        shared = await self.shared.read() if self.shared is not None else None
        names = (str(local_path), self._shared_name())
        doc, why, source = choose_resume(local, shared, self._last_lease_epoch, names)
        for found, where in ((local, str(local_path)), (shared, self._shared_name())):
            if found is not None and found.kind not in ("ok", "missing"):
                log.warning("state at %s: %s", where, found.reason)
        if doc is not None and self.lease is not None and self.lease.owned and doc.epoch >= self.lease.epoch:
            why = f"handoff epoch {doc.epoch} cannot precede claimed epoch {self.lease.epoch}"
        applied = False
        if doc is not None and not why:
            applied, why = self.handover.apply(doc)
        source = source or str(local_path)
        self.resume_result = (applied, why)
        if applied:
            log.info("%s (from %s)", why, source)
            return applied, why
        log.warning("handoff not applied (%s): %s", source, why)
        await asyncio.to_thread(_keep_rejected, local_path)
        if self.core.config.engine_contract is not None and local.kind != "missing":
            self._restart_wave(f"handoff rejected: {why}")
        return applied, why

    @property
    def _last_lease_epoch(self) -> int:
        """The epoch the lease record held before our claim (0: none, or no lease)."""
        return self.lease.previous_epoch if self.lease is not None else 0

    def _shared_name(self) -> str:
        return self.shared.describe() if self.shared is not None else "shared handoff"

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
        with contextlib.suppress(PersistError):  # reported as control degraded
            await self.persister.persist()
        return ""

    def _start_loops(self) -> None:
        if self.keeper is not None and self.lease is not None and self.lease.owned:
            self._tasks.spawn(self.keeper.renew_forever(), "narwhal-lease-renewal")
        if self.monitor is not None:  # after claim/resume/takeover: never overwrite an unread file
            self.monitor.add_stage("handoff", self.write_handoff)
            self.monitored = True
        else:
            self._tasks.spawn(self._persist_loop(), "narwhal-handoff-writer")

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
            "lease_backend": "etcd" if self.settings.etcd_endpoints else ("file" if lease else ""),
            "lease": lease.describe() if lease is not None else "",
            "lease_valid": lease.valid() if lease is not None else None,
            "lease_remaining_s": round(lease.remaining(), 3) if lease is not None else None,
            "standby_of": self.settings.standby_of,
            "failed_probes": loop.misses if loop is not None else 0,
            "takeover_gap_s": self.takeover_gap_s,
            "state_path": self.settings.state_path,
            "persist_failures": self.persist_failures,
            "persist_degraded": self.persister.degraded,
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
            "# HELP narwhal_persist_failures_total State writes (shared handoff or state file) that failed.",
            "# TYPE narwhal_persist_failures_total counter",
            f"narwhal_persist_failures_total {self.persist_failures}",
            "# HELP narwhal_persist_degraded 1 while the last state write failed (lifecycle changes refused).",
            "# TYPE narwhal_persist_degraded gauge",
            f"narwhal_persist_degraded {int(bool(self.persister.degraded))}",
        ]


async def _nothing_to_write() -> None:
    """``Persist`` after a re-claim: the periodic writer (still running) writes the new epoch."""
