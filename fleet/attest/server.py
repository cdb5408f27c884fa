"""The sidecar's aiohttp app: ``GET /v1/attestation``, ``GET /v1/process``, ``GET /health``.

Binding runs in the background until it succeeds (an engine can take minutes to load a model):
until then every route answers 503 ``unbound`` with the reason. Every answer after that re-reads
the engine (``/version`` + ``/metrics``, and ``/proc/PID`` with ``--engine-pid``; that PID is only
bound when it holds a socket listening on the engine URL's port): a changed or
exited process latches ``changed`` (503 for good: restart the sidecar to bind the new process); an
unreachable engine answers 503 ``engine_unreachable`` for that request only. An attestation is only
ever served for the process that was bound, verified live in the same request.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
from aiohttp import web

from fleet.attest import proc
from fleet.attest.binding import Observation, attestation_for, bind_problem, change_problem
from router.engines.identity import ProcessStartError, read_process_start
from router.tasks import Tasks

log = logging.getLogger("narwhal.attest")
_JSON = "application/json"


class EngineUnreachable(Exception):
    pass


def _describe(exc: BaseException) -> str:
    return type(exc).__name__ if isinstance(exc, httpx.TransportError) or not str(exc) else f"{exc}"


@dataclass
class Settings:
    engine_url: str
    contract: dict[str, Any]
    pid: int | None = None
    api_key_env: str = ""
    timeout_s: float = 5.0
    bind_interval_s: float = 1.0
    max_start_skew_s: float = 60.0

    @property
    def engine_port(self) -> int:
        parts = urlsplit(self.engine_url)
        return parts.port or (443 if parts.scheme == "https" else 80)


class EngineReader:
    """Reads the engine's identity over HTTP and, with a PID, the process from ``/proc``."""

    def __init__(self, settings: Settings, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.s = settings
        headers = {}
        if settings.api_key_env and os.environ.get(settings.api_key_env):
            headers["authorization"] = f"Bearer {os.environ[settings.api_key_env]}"
        self.client = httpx.AsyncClient(
            base_url=settings.engine_url,
            headers=headers,
            timeout=settings.timeout_s,
            transport=transport,
            trust_env=False,
        )

    async def close(self) -> None:
        await self.client.aclose()

    async def _get(self, path: str) -> httpx.Response:
        try:
            resp = await self.client.get(path)
        except httpx.HTTPError as exc:
            raise EngineUnreachable(f"engine {path} unreachable: {_describe(exc)}") from None
        if resp.status_code != 200:
            raise EngineUnreachable(f"engine {path} answered HTTP {resp.status_code}")
        return resp

    async def observe(self, models: bool = False) -> Observation:
        """Raises ``proc.ProcessGone`` (PID exited) or ``EngineUnreachable``."""
        pid_start = proc.start_time(self.s.pid) if self.s.pid is not None else None
        try:
            version = orjson.loads((await self._get("/version")).content).get("version")
        except (orjson.JSONDecodeError, AttributeError):
            raise EngineUnreachable("engine /version is not a JSON object") from None
        if not isinstance(version, str) or not version:
            raise EngineUnreachable("engine /version has no version string")
        try:
            start = read_process_start((await self._get("/metrics")).text)
        except ProcessStartError as exc:
            raise EngineUnreachable(f"engine {exc}") from None
        served: tuple[str, ...] = ()
        if models:
            try:
                data = orjson.loads((await self._get("/v1/models")).content).get("data")
                served = tuple(str(m["id"]) for m in data if isinstance(m, dict) and "id" in m)
            except (orjson.JSONDecodeError, AttributeError, TypeError):
                raise EngineUnreachable("engine /v1/models is not a model list") from None
        return Observation(version, start, served, pid_start)


class Sidecar:
    def __init__(
        self,
        settings: Settings,
        reader: EngineReader | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.s = settings
        self.reader = reader or EngineReader(settings)
        self.wall = wall
        self.bound: Observation | None = None
        self.document: dict[str, Any] | None = None
        self.bound_at: float | None = None
        self.status = "unbound"
        self.reason = f"binding to the engine at {settings.engine_url} has not finished"
        self.bind_attempts = 0
        self._tasks = Tasks(log)

    # -- binding ------------------------------------------------------------------------------
    async def try_bind(self) -> bool:
        self.bind_attempts += 1
        try:
            obs = await self.reader.observe(models=True)
        except proc.ProcessGone as exc:
            self._latch(f"engine process exited before {self.s.engine_url} could be bound: {exc}")
            return False
        except EngineUnreachable as exc:
            self.reason = f"not bound yet: {exc}"
            return False
        problem = ""
        if self.s.pid is not None:  # first: the PID must be what answers on the engine's port
            try:
                problem = proc.port_problem(self.s.pid, self.s.engine_port)
            except proc.ProcessGone as exc:
                self._latch(f"engine process exited while binding: {exc}")
                return False
        problem = problem or bind_problem(obs, self.s.contract, self.s.pid, self.s.max_start_skew_s)
        if problem:
            self.reason = f"not bound: {problem}"
            return False
        args = None
        if self.s.pid is not None:
            try:
                args = proc.cmdline(self.s.pid)
            except proc.ProcessGone as exc:
                self._latch(f"engine process exited while binding: {exc}")
                return False
        self.bound, self.document = obs, attestation_for(obs, self.s.contract, args)
        self.bound_at, self.status, self.reason = self.wall(), "ok", ""
        log.info(
            "bound to the engine at %s (version %s, process start %r%s)",
            self.s.engine_url,
            obs.version,
            obs.process_start,
            f", PID {self.s.pid}" if self.s.pid is not None else "",
        )
        return True

    def _latch(self, reason: str) -> None:
        if self.status != "changed":
            log.error("%s", reason)
        self.status, self.reason = "changed", reason

    async def _bind_loop(self) -> None:
        while self.status == "unbound" and not await self.try_bind():
            if self.status == "unbound":
                log.info("%s (retrying every %.1fs)", self.reason, self.s.bind_interval_s)
            await asyncio.sleep(self.s.bind_interval_s)

    async def live_problem(self) -> tuple[str, str]:
        """("", "") when the bound process is live and unchanged, else (status, reason)."""
        if self.status != "ok" or self.bound is None:
            return self.status, self.reason
        try:
            now = await self.reader.observe()
        except proc.ProcessGone as exc:
            self._latch(f"the bound engine process exited ({exc}); restart narwhal-attest with the new one")
            return self.status, self.reason
        except EngineUnreachable as exc:
            return "engine_unreachable", str(exc)
        problem = change_problem(self.bound, now, self.s.pid)
        if problem:
            self._latch(problem)
            return self.status, self.reason
        return "", ""

    # -- aiohttp ------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/attestation", self.attestation)
        app.router.add_get("/v1/process", self.process)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, _: web.Application) -> None:
        self._tasks.spawn(self._bind_loop(), "narwhal-attest-bind")

    async def _on_cleanup(self, _: web.Application) -> None:
        await self._tasks.stop()
        await self.reader.close()

    @staticmethod
    def _json(doc: Any, status: int = 200) -> web.Response:
        return web.Response(status=status, body=orjson.dumps(doc), content_type=_JSON)

    def _refusal(self, status: str, reason: str) -> web.Response:
        return self._json(
            {
                "status": status,
                "error": {"message": reason, "type": "attestation_unavailable", "code": status},
            },
            503,
        )

    async def health(self, _: web.Request) -> web.Response:
        status, reason = await self.live_problem()
        if status:
            return self._refusal(status, reason)
        assert self.bound is not None
        return self._json(
            {
                "status": "ok",
                "engine_url": self.s.engine_url,
                "pid": self.s.pid,
                "process_start_time_seconds": self.bound.process_start,
                "bound_at": self.bound_at,
            }
        )

    async def attestation(self, _: web.Request) -> web.Response:
        status, reason = await self.live_problem()
        if status:
            return self._refusal(status, reason)
        return self._json(self.document)

    async def process(self, _: web.Request) -> web.Response:
        status, reason = await self.live_problem()
        if status:
            return self._refusal(status, reason)
        assert self.bound is not None
        own = self.bound.pid_start if self.bound.pid_start is not None else self.bound.process_start
        return self._json(
            {
                "process_start_time_seconds": own,
                "engine_process_start_time_seconds": self.bound.process_start,
                "pid": self.s.pid,
                "source": "proc" if self.s.pid is not None else "metrics",
            }
        )
