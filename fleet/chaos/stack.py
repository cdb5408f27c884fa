"""The chaos drill's processes: a ``narwhal-up`` stack (``fleet/up/stack.py``) on free loopback
ports — Temporal dev server, worker, supervisor with simulated engines, a primary and a standby
router on one lease — whose children the drill kills (SIGKILL) and restarts by PID."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from fleet.procs import Child, stop_pid
from fleet.up.ports import Ports, free_port, port_free
from fleet.up.stack import Stack as UpStack
from fleet.up.stack import Timings as UpTimings
from fleet.up.stack import together

FLEET_NAME = "chaos"


def chaos_timings() -> UpTimings:
    """Fast failover timings; engines get 180 s to come up on a loaded machine."""
    return replace(
        UpTimings.fast(), monitor_interval=0.2, ttft_base_ms=2.0, itl_ms=2.0, health_timeout_s=180.0
    )


def free_plan(n_engines: int) -> Ports:
    """A narwhal-up port plan on free loopback ports (engines on consecutive free ports)."""
    while True:
        base = free_port()
        if all(port_free(base + i) for i in range(n_engines)):
            break
    return Ports(
        temporal=free_port(), temporal_http=free_port(), temporal_metrics=free_port(), ui=free_port(),
        supervisor=free_port(), router=free_port(), standby=free_port(),
        etcd_client=free_port(), etcd_peer=free_port(), engine_base=base, engines=n_engines,
    )  # fmt: skip


class ChaosStack:
    """The drill's processes: a ``narwhal-up`` stack (``fleet/up/stack.py``) on free loopback ports,
    with router ``r0`` = its primary and ``r1`` = its standby; faults kill children by PID."""

    NAMES = ("primary", "standby")

    def __init__(self, tmp: Path, n_engines: int, sim_options: dict[str, Any]) -> None:
        self.tmp = tmp
        self.up = UpStack(tmp, free_plan(n_engines), chaos_timings(), FLEET_NAME, sim_options=sim_options)
        self.iids = self.up.iids
        self.roles = self.up.roles

    # -- addresses + children -------------------------------------------------------------------
    @property
    def temporal_address(self) -> str:
        return self.up.temporal_address

    @property
    def supervisor_url(self) -> str:
        return self.up.supervisor_url

    def router_url(self, i: int) -> str:
        return self.up.routers[self.NAMES[i]]

    @property
    def router_urls(self) -> list[str]:
        return [self.router_url(i) for i in range(2)]

    def child(self, name: str) -> Child:
        return self.up.procs.children[name]

    def router_child(self, i: int) -> Child:
        return self.child(f"router-{self.NAMES[i]}")

    async def kill(self, child: Child) -> None:
        """SIGKILL by PID (an injected fault, not a crash of the stack)."""
        await self.up.procs.kill(child.name)

    # -- components -----------------------------------------------------------------------------
    async def start_temporal(self) -> None:
        await self.up.start_temporal()

    async def start_worker(self) -> None:
        await self.up.start_worker()

    async def start_router(self, i: int, standby_of: str = "") -> None:
        await self.up.start_router(self.NAMES[i], standby_of)

    async def supervisor_engines(self) -> dict[str, dict[str, Any]]:
        return await self.up.engines()

    async def router_ready(self, http: httpx.AsyncClient, i: int) -> int:
        """/ready status of router i (0 when it does not answer)."""
        try:
            return (await http.get(self.router_url(i) + "/ready", timeout=1.0)).status_code
        except httpx.HTTPError:
            return 0

    async def wait_router(self, i: int, ok: tuple[int, ...], within_s: float = 60.0) -> None:
        deadline = time.monotonic() + within_s
        async with httpx.AsyncClient() as http:
            while time.monotonic() < deadline:
                child = self.up.procs.children.get(f"router-{self.NAMES[i]}")
                if child is not None and not child.alive() and child.killed_at is None:
                    raise RuntimeError(f"router r{i} exited:\n{child.tail()}")
                if await self.router_ready(http, i) in ok:
                    return
                await asyncio.sleep(0.05)
        raise TimeoutError(f"router r{i} not answering /ready {ok}")

    async def active_router(self, http: httpx.AsyncClient) -> int | None:
        for i in range(2):
            if await self.router_ready(http, i) == 200:
                return i
        return None

    def restart_args(self) -> list[str]:
        args = self.up.restart_args("rolling")
        args[args.index("--requested-by") + 1] = "chaos-drill"
        return args

    async def bring_up(self) -> None:
        """Temporal beside the supervisor (with its engines), then the worker beside the routers."""
        self.up.write_configs()
        await together(self.up.start_temporal(), self.up.start_supervisor())
        await together(self.up.start_worker(), self.up.start_routers())

    async def close(self) -> None:
        await self.up.procs.stop_all()

    def close_now(self) -> None:
        """Synchronous last resort (the drill was interrupted): stop every child by PID."""
        for child in reversed(list(self.up.procs.children.values())):
            stop_pid(child.popen, child.grace_s)
