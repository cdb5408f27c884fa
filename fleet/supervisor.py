"""``narwhal-supervisor``: a local HTTP service that owns engine processes and restarts them.

API: ``GET /health``, ``GET /engines``, ``POST /engines/{iid}/restart`` (optional
``{"if_process_start": float}`` idempotency guard), ``POST /engines/{iid}/stop``,
``POST /engines/{iid}/start``, ``POST /engines/{iid}/build`` (``{"build": NAME}``: the named build
of the config's ``builds`` that the next start or restart launches; ``""`` = as configured). On SIGTERM/SIGINT every engine it started is stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import ValidationError

from fleet.managed import EngineStartError, ManagedEngine, SupervisorConfig
from router.logs import setup_logging

log = logging.getLogger("narwhal.supervisor")


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.json_response(obj, status=status)


class Supervisor:
    def __init__(self, cfg: SupervisorConfig, session: aiohttp.ClientSession) -> None:
        self.cfg = cfg
        self.engines = {e.iid: ManagedEngine(e, session, cfg) for e in cfg.engines}

    async def start_all(self) -> None:
        results = await asyncio.gather(*(e.start() for e in self.engines.values()), return_exceptions=True)
        for iid, res in zip(self.engines, results, strict=True):
            if isinstance(res, BaseException):
                log.error("engine %s failed to start: %s", iid, res)

    async def stop_all(self) -> None:
        await asyncio.gather(*(e.shutdown() for e in self.engines.values()), return_exceptions=True)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/engines", self.list_engines)
        app.router.add_post("/engines/{iid}/restart", self.restart)
        app.router.add_post("/engines/{iid}/stop", self.stop)
        app.router.add_post("/engines/{iid}/start", self.start)
        app.router.add_post("/engines/{iid}/build", self.stage_build)
        return app

    def _engine(self, request: web.Request) -> ManagedEngine | web.Response:
        iid = request.match_info["iid"]
        engine = self.engines.get(iid)
        if engine is None:
            return _json({"error": f"unknown engine: {iid}"}, 404)
        return engine

    async def health(self, _request: web.Request) -> web.Response:
        return _json({"status": "ok"})

    async def list_engines(self, _request: web.Request) -> web.Response:
        docs = await asyncio.gather(*(e.describe() for e in self.engines.values()))
        return _json({"engines": dict(zip(self.engines, docs, strict=True))})

    async def restart(self, request: web.Request) -> web.Response:
        engine = self._engine(request)
        if isinstance(engine, web.Response):
            return engine
        guard: float | None = None
        if request.can_read_body:
            try:
                body = await request.json()
            except ValueError:
                return _json({"error": "body must be JSON"}, 400)
            if body is not None:
                if not isinstance(body, dict):
                    return _json({"error": "body must be a JSON object"}, 400)
                value = body.get("if_process_start")
                if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
                    return _json({"error": "if_process_start must be a number"}, 400)
                guard = None if value is None else float(value)
        try:
            return _json(await engine.restart(guard))
        except EngineStartError as exc:
            return _json({"iid": engine.entry.iid, "error": str(exc)}, 500)

    async def stage_build(self, request: web.Request) -> web.Response:
        engine = self._engine(request)
        if isinstance(engine, web.Response):
            return engine
        try:
            body = await request.json()
        except ValueError:
            return _json({"error": "body must be JSON"}, 400)
        build = body.get("build") if isinstance(body, dict) else None
        if not isinstance(build, str):
            return _json({"error": 'body must be {"build": NAME}'}, 400)
        try:
            engine.stage(build)
        except KeyError:
            known = ", ".join(sorted(self.cfg.builds)) or "none configured"
            return _json({"error": f"unknown build {build!r} (builds: {known})"}, 400)
        log.info("engine %s: next launch runs build %s", engine.entry.iid, build or "(as configured)")
        return _json({"iid": engine.entry.iid, "staged_build": build})

    async def stop(self, request: web.Request) -> web.Response:
        engine = self._engine(request)
        if isinstance(engine, web.Response):
            return engine
        return _json(await engine.stop())

    async def start(self, request: web.Request) -> web.Response:
        engine = self._engine(request)
        if isinstance(engine, web.Response):
            return engine
        try:
            return _json(await engine.start())
        except EngineStartError as exc:
            return _json({"iid": engine.entry.iid, "error": str(exc)}, 500)


def load_config(path: str | Path) -> SupervisorConfig:
    return SupervisorConfig.model_validate(json.loads(Path(path).read_text(encoding="utf-8")))


async def serve(cfg: SupervisorConfig, host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with aiohttp.ClientSession() as session:
        sup = Supervisor(cfg, session)
        runner = web.AppRunner(sup.app(), access_log=None, shutdown_timeout=1.0)
        try:
            starting = asyncio.create_task(sup.start_all())
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
            if not stop.is_set():
                await runner.setup()
                await web.TCPSite(runner, host, port, reuse_address=True).start()
                print(f"narwhal-supervisor listening on http://{host}:{port}", flush=True)
                await stopping
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
        finally:
            await runner.cleanup()
            await sup.stop_all()
            log.info("supervisor stopped all engines")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="narwhal-supervisor", description=__doc__)
    ap.add_argument(
        "--config", required=True, help="JSON: {engines: [{iid, url, command}], health_timeout_s}"
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8900)
    ap.add_argument("--log-level", default="INFO")
    a = ap.parse_args(argv)
    setup_logging(a.log_level)  # engine health polls (httpx) only at debug
    try:
        cfg = load_config(a.config)
    except (OSError, ValueError, ValidationError) as exc:
        print(f"narwhal-supervisor: bad --config {a.config}: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve(cfg, a.host, a.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
