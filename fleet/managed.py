"""One engine process owned by the supervisor: start, stop (by PID / own process group), restart."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from typing import Any

import aiohttp
from pydantic import BaseModel, ConfigDict, Field

from fleet.procs import spawn_async
from router.engines.identity import process_start_or_none, same_process

log = logging.getLogger("narwhal.supervisor")

_PROBE_TIMEOUT = aiohttp.ClientTimeout(total=2.0)
_POLL_S = 0.05
_PR_SET_PDEATHSIG = 1


class EngineEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    iid: str = Field(min_length=1)
    url: str = Field(min_length=1)
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)


class SupervisorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    engines: list[EngineEntry]
    # named builds: arguments appended to an engine's command when that build is staged
    # (``POST /engines/{iid}/build``); the simulator's degraded builds are made this way
    builds: dict[str, list[str]] = Field(default_factory=dict)
    health_timeout_s: float = Field(default=30.0, gt=0)
    stop_grace_s: float = Field(default=5.0, ge=0)


class EngineStartError(RuntimeError):
    pass


def parse_process_start(metrics_text: str) -> float | None:
    return process_start_or_none(metrics_text)


class ManagedEngine:
    def __init__(self, entry: EngineEntry, session: aiohttp.ClientSession, cfg: SupervisorConfig) -> None:
        self.entry = entry
        self.url = entry.url.rstrip("/")
        self.session = session
        self.cfg = cfg
        self.proc: asyncio.subprocess.Process | None = None
        self.lock = asyncio.Lock()
        self.restarts = 0
        # process start of the last process this supervisor launched and saw ready; used when the
        # live /metrics read fails (hung or SIGSTOPped engine) and for a crashed engine's guard
        self.last_start: float | None = None
        self.staged_build = ""  # the build the next start / restart launches ("" = the command as configured)
        self.build = ""  # the build of the running process

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    async def process_start(self) -> float | None:
        if not self.running:
            return None
        try:
            async with self.session.get(self.url + "/metrics", timeout=_PROBE_TIMEOUT) as resp:
                if resp.status != 200:
                    return None
                return parse_process_start(await resp.text())
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def _healthy(self) -> bool:
        try:
            async with self.session.get(self.url + "/health", timeout=_PROBE_TIMEOUT) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def identity(self) -> float | None:
        """Live process start, else the recorded start of the process we launched last."""
        live = await self.process_start()
        return live if live is not None else self.last_start

    def stage(self, build: str) -> None:
        """The next start or restart launches ``build`` (a name from the config's ``builds``)."""
        if build and build not in self.cfg.builds:
            raise KeyError(build)
        self.staged_build = build

    def command(self) -> list[str]:
        return [*self.entry.command, *self.cfg.builds.get(self.staged_build, [])]

    async def describe(self) -> dict[str, Any]:
        running = self.running
        return {
            "build": self.build if running else None,
            "staged_build": self.staged_build,
            "url": self.url,
            "pid": self.pid if running else None,
            "running": running,
            "process_start": await self.identity() if running else None,
            "restarts": self.restarts,
        }

    async def _launch(self) -> None:
        env = {**os.environ, **self.entry.env} if self.entry.env else None
        command = self.command()
        self.proc = await spawn_async(command, env)  # dies with the supervisor
        self.build = self.staged_build
        log.info("started %s pid %d: %s", self.entry.iid, self.proc.pid, " ".join(command))

    async def _wait_ready(self, old_start: float | None) -> float:
        deadline = time.monotonic() + self.cfg.health_timeout_s
        while time.monotonic() < deadline:
            if not self.running:
                code = self.proc.returncode if self.proc is not None else None
                raise EngineStartError(f"engine {self.entry.iid} exited with code {code} during startup")
            if await self._healthy():
                start = await self.process_start()
                if start is not None and not same_process(start, old_start):
                    return start
            await asyncio.sleep(_POLL_S)
        raise EngineStartError(f"engine {self.entry.iid} not healthy after {self.cfg.health_timeout_s}s")

    async def _terminate(self) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), self.cfg.stop_grace_s)
            except TimeoutError:
                log.warning("engine %s pid %d ignored SIGTERM; killing", self.entry.iid, proc.pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        # anything the engine left behind in its own process group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.returncode

    async def start(self) -> dict[str, Any]:
        async with self.lock:
            if self.running:
                return {"iid": self.entry.iid, "started": False, "pid": self.pid}
            await self._launch()
            start = await self._wait_ready(None)
            self.last_start = start
            return {"iid": self.entry.iid, "started": True, "pid": self.pid, "process_start": start}

    async def stop(self) -> dict[str, Any]:
        async with self.lock:
            if not self.running:
                return {"iid": self.entry.iid, "stopped": False, "pid": None}
            pid = self.pid
            code = await self._terminate()
            return {"iid": self.entry.iid, "stopped": True, "pid": pid, "returncode": code}

    async def restart(self, if_process_start: float | None) -> dict[str, Any]:
        async with self.lock:
            old_pid = self.pid if self.running else None
            old_start = await self.identity()
            if if_process_start is not None and (
                old_start is None or not same_process(old_start, if_process_start)
            ):
                return {
                    "iid": self.entry.iid,
                    "restarted": False,
                    "reason": "process_start differs from if_process_start",
                    "pid": old_pid,
                    "process_start": old_start,
                }
            await self._terminate()
            await self._launch()
            self.restarts += 1
            new_start = await self._wait_ready(old_start)
            self.last_start = new_start
            return {
                "iid": self.entry.iid,
                "restarted": True,
                "old_pid": old_pid,
                "new_pid": self.pid,
                "old_process_start": old_start,
                "new_process_start": new_start,
            }

    async def shutdown(self) -> None:
        """Stop at supervisor exit, without waiting for an in-flight start/restart to finish."""
        await self._terminate()
