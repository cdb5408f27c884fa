"""Helpers for the restart-workflow integration tests (Temporal dev server + real stack)."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import Callable
from typing import Any

from temporalio.client import WorkflowHandle

from narwhal_models.restart import (
    RestartPlan,
    RestartProgress,
    RestartResult,
    RouterRef,
    SupervisorRef,
    Timing,
    fleet_workflow_id,
)
from tests.integration.conftest import Temporal
from tests.support import loopback
from tests.support.procs import script
from tests.support.worker_config import session_worker_config

FAST = Timing(poll_interval_s=0.2, heartbeat_timeout_s=2.0, new_process_timeout_s=120, confirm_timeout_s=60)


def new_fleet(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def worker_routers(args: tuple[str, ...] | list[str]) -> list[str]:
    """``start``/``schedule create`` arguments → the ``--worker-router NAME`` the session worker
    knows the ``--router`` URLs by (configured here, as an operator configures the worker)."""
    urls = [args[i + 1] for i, a in enumerate(args) if a == "--router"]
    if not urls or "--worker-router" in args:
        return []
    return ["--worker-router", session_worker_config().allow_routers(urls)]


def cli(t: Temporal, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    n = 2 if args[0] == "schedule" else 1  # the address goes after the (sub)command
    extra = (
        worker_routers(args)
        if args[0] in ("start", "schedule") and args[n - 1] in ("start", "create")
        else []
    )
    return subprocess.run(
        [script("narwhal-restart"), *args[:n], "--address", t.address, *args[n:], *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def plan(
    fleet: str, routers: list[str], supervisor: str, configured: list[str] | None = None, **kw: Any
) -> RestartPlan:
    """``configured``: every URL the worker may call for this router (default ``routers``)."""
    name = session_worker_config().allow_routers(configured or routers)
    return RestartPlan(
        fleet=fleet,
        router=RouterRef(name=name, routers=routers),
        supervisor=SupervisorRef(backend="local", url=supervisor),
        timing=FAST,
        **kw,
    )


async def start(t: Temporal, queue: str, p: RestartPlan) -> WorkflowHandle[Any, RestartResult]:
    return await t.client.start_workflow(
        "WaveRestart" if p.mode == "wave" else "RollingRestart",
        p,
        id=fleet_workflow_id(p.fleet),
        task_queue=queue,
        result_type=RestartResult,
    )


async def progress(handle: WorkflowHandle[Any, Any]) -> RestartProgress:
    from datetime import timedelta

    return await handle.query("progress", result_type=RestartProgress, rpc_timeout=timedelta(seconds=5))


async def until(what: str, check: Callable[[], Any], within: float = 60.0) -> Any:
    """Async poll (keeps the session loop free); ``check`` may be a coroutine function."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last: Any = None
    while loop.time() < deadline:
        last = check()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def supervisor_restarts(supervisor: str) -> dict[str, int]:
    body = loopback.get(f"{supervisor}/engines", timeout=5).json()
    return {iid: int(e["restarts"]) for iid, e in body["engines"].items()}


def lifecycle(router_url: str) -> dict[str, Any]:
    doc: dict[str, Any] = loopback.get(f"{router_url}/narwhal/lifecycle", timeout=5).json()
    return doc


def engine_state(router_url: str, iid: str) -> str:
    return str(lifecycle(router_url)["engines"][iid]["state"])
