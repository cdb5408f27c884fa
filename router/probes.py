"""The breaker's I/O side: runs the probes the breaker asks for, and recovers ejected engines.

* ``handle(decision)``: health probe (timeout/overload streaks) or inference probe (suspects).
* A periodic pass every ``interval_s`` (default ``controller.monitor_interval_s ×
  recovery.readmit_every``) probes ejected engines and re-verifies inference suspects.
  Contract-free readmission: ``/health`` 200 and a direct 1-token generation (plus an inference
  probe for suspects). When ``recovery_validator`` is set (fleets with an ``engine_contract``,
  wired by the lifecycle component), it is called instead and owns the readmission; the control
  mode (``core.mode``, router/control_mode.py) picks the validator that applies right now.
The pass is skipped while a fleet hold is active, and while this router does not control the fleet
unless the mode recovers its own ejections (active-active).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import orjson
from aiohttp import web

from router.breaker import Breaker, Decision
from router.core import RouterCore
from router.engines.control import EngineControl
from router.engines.legs import EngineClient, LegFailure, decode_body, prefill_body
from router.tasks import Tasks

log = logging.getLogger("narwhal.probes")
_PROBE_BODY: dict[str, Any] = {"prompt": "narwhal inference probe", "max_tokens": 2, "temperature": 0.0}


class Prober:
    def __init__(
        self,
        core: RouterCore,
        breaker: Breaker,
        engines: EngineClient,
        control: EngineControl,
        interval_s: float | None = None,
    ) -> None:
        self.core = core
        self.breaker = breaker
        self.engines = engines  # the fabric probe's legs: the data-plane path clients use
        self.control = control  # health and the direct generation: the one engine-control client
        cfg = core.config
        self.interval_s = interval_s or cfg.controller.monitor_interval_s * cfg.recovery.readmit_every
        self.tick_s = min(cfg.controller.monitor_interval_s, self.interval_s)
        self.recovery_validator: Callable[[str], Awaitable[bool]] | None = None
        self._tasks = Tasks(log)  # the pass loop and the probes in flight
        self._suspect_checked: dict[str, float] = {}

    # -- component protocol -----------------------------------------------------------------
    def add_routes(self, app: web.Application) -> None:
        return None

    async def start(self) -> None:
        self._tasks.spawn(self._run(), "narwhal-probes")

    async def stop(self) -> None:
        await self._tasks.stop()

    # -- breaker decisions ------------------------------------------------------------------
    def handle(self, decision: Decision) -> None:
        if decision.action == "probe_health":
            self._spawn(decision.iid, self._health_probe(decision.iid))
        elif decision.action == "probe_inference":
            self._spawn(decision.iid, self._inference_probe(decision.iid))
        elif decision.action in ("eject", "spared"):
            log.warning("breaker: engine %s %s (%s)", decision.iid, decision.action, decision.cause)

    def _spawn(self, iid: str, coro: Coroutine[Any, Any, None]) -> None:
        if iid in self.breaker.probing:
            coro.close()
            return
        self.breaker.probing.add(iid)

        async def run() -> None:
            try:
                await coro
            except Exception:
                log.exception("probe of %s failed", iid)
            finally:
                self.breaker.probing.discard(iid)

        self._tasks.spawn(run(), f"narwhal-probe-{iid}")

    async def _health_probe(self, iid: str) -> None:
        ok = await self.control.health(iid)
        self.handle(self.breaker.health_result(iid, ok))

    async def _inference_probe(self, iid: str) -> None:
        self._suspect_checked[iid] = self.core.clock.monotonic()
        ok = await self.verify_paths(iid)
        self.handle(self.breaker.inference_result(iid, ok))

    async def verify_paths(self, iid: str) -> bool | None:
        """Probe every recorded producer path into suspect ``iid``; None if a new path appeared."""
        before = set(self.core.scheduler.inference_suspects.get(iid, set())) or {""}
        for producer in sorted(before):
            if not await self.fabric_probe(producer, iid):
                return False
        after = self.core.scheduler.inference_suspects.get(iid)
        if after is not None and not after <= before:
            return None  # new failing path recorded meanwhile: verification stays pending
        return True

    async def fabric_probe(self, producer: str, consumer: str) -> bool:
        """Prefill on ``producer`` (the consumer itself when "" or unavailable) → decode ≥1 token."""
        sched, engines = self.core.scheduler, self.engines
        if not producer or producer == consumer or not sched.accepts_new(producer):
            producer = consumer
        src, dst = sched.engines[producer], sched.engines[consumer]
        body = {**_PROBE_BODY, "model": self.core.config.model}
        rid = f"narwhal-probe-{consumer}"
        stream = None
        try:
            desc = await engines.prefill(
                src.iid, src.url, "/v1/completions", prefill_body(body, body["model"]), rid + "-prefill"
            )
            dbody = decode_body(body, body["model"], None if src.iid == dst.iid else desc)
            async with asyncio.timeout(self.core.config.engine.first_token_timeout_s):
                stream = await engines.open_decode(
                    dst.iid, dst.url, "/v1/completions", dbody, rid + "-decode"
                )
                while (payload := await stream.next_data()) is not None:
                    doc = orjson.loads(payload)
                    choices = doc.get("choices") if isinstance(doc, dict) else None
                    if isinstance(choices, list) and any(
                        isinstance(c, dict) and (c.get("token_ids") or c.get("text")) for c in choices
                    ):
                        return True
            return False
        except (LegFailure, TimeoutError, orjson.JSONDecodeError):
            return False
        finally:
            if stream is not None:
                stream.close()

    # -- periodic recovery ------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            try:
                self.pass_once()
            except Exception:
                log.exception("probe pass failed")

    def pass_once(self) -> None:
        core = self.core
        # active-active: breaker evidence is each replica's own, so every replica probes its ejections
        if (not core.controls_fleet() and not core.mode.recovers_own_ejections) or core.scheduler.fleet_hold:
            return
        for iid in self.breaker.due_for_readmission(self.interval_s):
            self._spawn(iid, self._recover(iid))
        now = core.clock.monotonic()
        for iid in sorted(core.scheduler.inference_suspects):
            if iid in core.scheduler.ejected or iid in self.breaker.probing:
                continue
            if now - self._suspect_checked.get(iid, float("-inf")) >= self.interval_s:
                self._spawn(iid, self._inference_probe(iid))

    async def _recover(self, iid: str) -> None:
        validator = self.core.mode.recovery_validator(self.recovery_validator)
        if validator is not None:
            ok: bool | None = await validator(iid)
            self.breaker.readmission_probe(iid, ok, "lifecycle")
            return
        ok = await self.control.health(iid) and await self.control.generation_ok(iid, "narwhal-probe")
        if ok and iid in self.core.scheduler.inference_suspects:
            ok = await self.verify_paths(iid)
        if self.breaker.readmission_probe(iid, ok, "health"):
            log.info("engine %s readmitted after a successful recovery probe", iid)
