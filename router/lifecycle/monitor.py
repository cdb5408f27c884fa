"""Background lifecycle monitoring (spec §7): liveness, process identities, automatic recovery.

Every ``controller.monitor_interval_s`` (skipped while this router does not control the fleet or a
whole-wave hold is active):

* identity check of all engines when identities are unvalidated (startup, takeover, restore):
  records ``process_starts``; ``core.identities_ready`` turns true when it finishes;
* every ``recovery.liveness_every`` passes: ``GET /health`` of engines that are neither ejected nor
  held; ``liveness_misses`` misses in a row eject (``liveness``); engines that answered get their
  identity checked, and a process start that changed behind the router's back is ejected
  (``process_identity``, event ``process_excluded``) on contracted fleets. The sweep reads every
  engine's process start (``/metrics``) each time; ``/version`` and the attestation are read again
  only when that start is not the accepted one this monitor already verified them for (a process
  keeps its build and its attestation for life), so a restarted or replaced process takes the full
  check, as before, and an unchanged one costs one read instead of three;
* recovery of ejected engines runs through the prober's ``recovery_validator`` (contracted fleets):
  ``individual`` → lifecycle recovery validation on the running process; ``whole_wave`` → restart hold.
  Without a prober, this monitor runs the same pass every ``recovery.readmit_every`` passes.

Stages (spec §7.1): ``identity`` → ``liveness`` → ``readmission`` (only without a prober) → the
stages other components register with ``add_stage`` (HA: ``handoff``, the state
file write, which also runs while a whole-wave hold skips the others). Each stage's exception is
isolated: the pass goes on with the next stage. After ``controller.monitor_failure_limit``
consecutive passes with a failing stage, ``core.monitoring_degraded`` is ``"<stage> <Class>"``
(``/ready`` 503 ``monitoring degraded: …``, new prefill placement refused) until a clean pass.
Journal events: ``monitoring_stage_failure``, ``monitoring_degraded``, ``monitoring_recovered``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from router.attestation import verify_attestation
from router.core import RouterCore
from router.engines.identity import same_process
from router.lifecycle.served_model import check_served_models
from router.lifecycle.service import LifecycleService
from router.probes import Prober
from router.tasks import Tasks

log = logging.getLogger("narwhal.lifecycle.monitor")

Stage = Callable[[], Awaitable[object]]


@dataclass
class MonitorHealth:
    """Pure bookkeeping of failing passes → ``monitoring_degraded`` (spec §7.1); returns journal rows."""

    limit: int
    failing_passes: int = 0  # consecutive passes with at least one failing stage
    degraded: str = ""  # "<stage> <Class>" once failing_passes reached the limit
    last_failures: list[str] = field(default_factory=list)

    def record(self, failures: list[tuple[str, BaseException]], at: float) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        if not failures:
            if self.degraded:
                rows.append(
                    {"event": "monitoring_recovered", "at": at, "was": self.degraded,
                     "failing_passes": self.failing_passes}
                )  # fmt: skip
            self.failing_passes, self.degraded, self.last_failures = 0, "", []
            return rows
        self.failing_passes += 1
        self.last_failures = [f"{stage} {type(exc).__name__}" for stage, exc in failures]
        if self.failing_passes <= self.limit:  # after that: one monitoring_degraded row, no flood
            for stage, exc in failures:
                rows.append(
                    {"event": "monitoring_stage_failure", "at": at, "stage": stage,
                     "error": f"{type(exc).__name__}: {exc}", "consecutive": self.failing_passes}
                )  # fmt: skip
        if self.failing_passes >= self.limit:
            reason = self.last_failures[0]
            if reason != self.degraded:
                self.degraded = reason
                rows.append(
                    {"event": "monitoring_degraded", "at": at, "reason": reason,
                     "failing_passes": self.failing_passes, "limit": self.limit}
                )  # fmt: skip
        return rows


class LifecycleMonitor:
    def __init__(
        self,
        core: RouterCore,
        service: LifecycleService,
        eject: Callable[[str, str], object] | None = None,
        prober: Prober | None = None,
    ) -> None:
        self.core = core
        self.service = service
        self.machine = service.machine
        self.control = service.control
        self.eject = eject or core.scheduler.eject
        self.prober = prober
        cfg = core.config
        self.contracted = cfg.engine_contract is not None
        self.interval_s = cfg.controller.monitor_interval_s
        self.misses: dict[str, int] = {}
        # iid → the process start whose /version + attestation the last full identity read verified
        self.verified: dict[str, float] = {}
        self.passes = 0
        self.health = MonitorHealth(cfg.controller.monitor_failure_limit)
        self._tasks = Tasks(log)
        self.stages: list[tuple[str, Stage]] = []  # run after the built-in stages, in order
        core.identities_ready = False  # /ready waits for the startup identity + model check

    # -- component protocol -----------------------------------------------------------------
    def add_routes(self, app: Any) -> None:
        return None

    async def start(self) -> None:
        if self.machine.policy == "whole_wave":
            self.core.scheduler.on_eject.append(self._on_eject)
        if self.prober is not None and self.contracted:
            self.prober.recovery_validator = self.recover
        self._tasks.spawn(self._run(), "narwhal-lifecycle-monitor")

    async def stop(self) -> None:
        await self._tasks.stop()

    def add_stage(self, name: str, stage: Stage) -> None:
        """Run ``stage`` in every pass after the built-in ones (once, however often it is added)."""
        if all(fn != stage for _, fn in self.stages):
            self.stages.append((name, stage))

    def _on_eject(self, iid: str, cause: str) -> None:
        if self.core.controls_fleet():  # active-active: a follower never mutates the lifecycle
            self.machine.require_restart_wave(f"engine {iid} was excluded")

    # -- loop -------------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            try:
                await self.pass_once()
            except Exception:
                log.exception("lifecycle monitor pass failed")
            await asyncio.sleep(self.interval_s)

    async def pass_once(self) -> None:
        """One monitor pass; every stage is isolated, the pass outcome feeds ``MonitorHealth``."""
        core = self.core
        if not core.controls_fleet():
            return
        failures: list[tuple[str, BaseException]] = []
        full = not core.scheduler.fleet_hold  # a whole-wave hold runs only the registered stages
        if full:
            if not core.identities_ready or not self.machine.process_starts:
                await self._stage("identity", self.check_identities, failures)
            self.passes += 1
            rec = core.config.recovery
            if rec.liveness_every > 0 and self.passes % rec.liveness_every == 0:
                await self._stage("liveness", self.liveness_sweep, failures)
            if self.prober is None and self.passes % rec.readmit_every == 0:
                await self._stage("readmission", self.recover_ejected, failures)
        for name, stage in list(self.stages):
            if core.controls_fleet():
                await self._stage(name, stage, failures)
        if not core.controls_fleet() or not (failures or full):
            return  # lost control mid-pass, or a partial pass: only a full pass is a clean one
        for row in self.health.record(failures, core.clock.wall()):
            core.journal.append(row)
        if self.health.degraded != core.monitoring_degraded:
            if self.health.degraded:
                log.error("monitoring degraded: %s", self.health.degraded)
            else:
                log.info("monitoring recovered (was %s)", core.monitoring_degraded)
            core.monitoring_degraded = self.health.degraded

    @staticmethod
    async def _stage(name: str, stage: Stage, failures: list[tuple[str, BaseException]]) -> None:
        try:
            await stage()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("monitor stage %s failed: %s: %s", name, type(exc).__name__, exc)
            failures.append((name, exc))

    async def recover_ejected(self) -> None:
        for iid in sorted(self.core.scheduler.ejected):
            await self.recover(iid)

    # -- identities (spec §7.2) -------------------------------------------------------------
    async def check_identities(self, engines: list[str] | None = None) -> None:
        """Compare live process starts with the accepted ones; record first sightings.

        Also checks that each engine lists the configured model (``served_model``): an engine
        that does not is held out of placement with the reason until it does.
        """
        targets = engines if engines is not None else self.core.config.engine_ids
        core = self.core
        await check_served_models(
            self.control, core.scheduler, core.config.model, targets, core.clock, core.journal.append
        )
        read = self._live_start if engines is None else self._sweep_start  # full at start/takeover
        results = await asyncio.gather(*(read(i) for i in targets))
        for iid, (start, problem) in zip(targets, results, strict=True):
            if not self.core.controls_fleet():
                return
            accepted = self.machine.process_starts.get(iid)
            if start is not None and not problem and accepted is None:
                self.machine.process_starts[iid] = start
                continue
            if start is not None and not problem and same_process(start, accepted):
                continue
            if not self.contracted:
                if start is not None:
                    self.machine.process_starts[iid] = start  # nothing to verify it against
                continue
            if iid in self.core.scheduler.draining or iid in self.core.scheduler.ejected:
                continue  # held by the lifecycle or already out: readmission validates it
            log.warning("engine %s process identity changed or unverifiable: %s", iid, problem or start)
            self.eject(iid, "process_identity")
            self.machine.note_process_excluded(iid, accepted, start)
        if engines is None:
            self.core.identities_ready = True

    async def _sweep_start(self, iid: str) -> tuple[float | None, str]:
        """The sweep's identity read: the process start alone while it is the accepted process
        this monitor verified; anything else (first sighting, restart, unreadable) the full read."""
        known = self.verified.get(iid)
        if known is None or not same_process(known, self.machine.process_starts.get(iid)):
            return await self._live_start(iid)
        try:
            start = await self.control.process_start(iid)
        except Exception as exc:
            return None, f"identity unreadable: {type(exc).__name__}"
        if same_process(start, known):
            return start, ""
        return await self._live_start(iid)

    async def _live_start(self, iid: str) -> tuple[float | None, str]:
        start, problem = await self._read_identity(iid)
        if start is not None and not problem:
            self.verified[iid] = start
        else:
            self.verified.pop(iid, None)
        return start, problem

    async def _read_identity(self, iid: str) -> tuple[float | None, str]:
        try:
            identity = await self.control.identity(iid)
        except Exception as exc:
            return None, f"identity unreadable: {type(exc).__name__}"
        contract = self.core.config.engine_contract
        if contract is not None and self.core.config.engine_by_id(iid).attestation_url:
            try:
                doc = await self.control.attestation(iid)
            except Exception as exc:
                return identity.process_start, f"attestation unreadable: {type(exc).__name__}"
            failures = verify_attestation(doc, contract, identity.version, identity.process_start)
            if failures:
                return identity.process_start, "attestation: " + "; ".join(failures)
        return identity.process_start, ""

    async def liveness_sweep(self) -> None:
        sched = self.core.scheduler
        targets = [i for i in sorted(sched.engines) if i not in sched.ejected and i not in sched.draining]
        healthy = await asyncio.gather(*(self.control.health(i) for i in targets))
        answered: list[str] = []
        for iid, ok in zip(targets, healthy, strict=True):
            if ok:
                self.misses[iid] = 0
                answered.append(iid)
                continue
            self.misses[iid] = self.misses.get(iid, 0) + 1
            if self.misses[iid] >= self.core.config.recovery.liveness_misses:
                self.misses[iid] = 0
                self.eject(iid, "liveness")
        if answered and self.core.controls_fleet() and not sched.fleet_hold:
            await self.check_identities(answered)

    # -- automatic recovery (spec §6.7, §7.3) -----------------------------------------------
    async def recover(self, iid: str) -> bool:
        """The prober's ``recovery_validator``: True once the engine was validated and readmitted."""
        sched = self.core.scheduler
        if iid not in sched.ejected:
            return False
        if self.machine.policy == "whole_wave":
            self.machine.require_restart_wave("an engine was excluded")
            return False
        if not await self.control.health(iid):
            return False  # still down: stay ejected, try again next pass (no blocked record)
        if not sched.eligible():
            everyone = self.core.config.engine_ids
            if sorted(sched.ejected) != everyone:
                return False
            if not all(await asyncio.gather(*(self.control.health(i) for i in everyone))):
                return False
            return await self.service.recover(everyone, wave=True)
        return await self.service.recover([iid])
