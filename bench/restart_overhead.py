"""Orchestration overhead of the restart workflows.

Runs a rolling and a whole-wave restart of N simulated engines (default 8 and 32) through a real
Temporal dev server, an in-process worker, a real router and the local supervisor, then reports

    overhead = workflow wall time − (engines' own drain + restart time)

where the engines' own time is measured separately: the supervisor's restart wall time per engine
(timed around its /engines/{iid}/restart call inside the worker — the activity's own HTTP call) and
the router's drain (drain POST → ready_to_stop) as observed by the workflow's step timings.
Rolling: sums over engines (sequential); wave: the max over engines (parallel).

    .venv/bin/python bench/restart_overhead.py [--sizes 8,32] [--modes rolling,wave]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from activities.worker_config import RouterEntry, WorkerConfig, WorkerSettings
from narwhal_models.restart import RestartPlan, RestartResult, RouterRef, SupervisorRef, Timing
from narwhal_testing.lifecycle import start_stack
from narwhal_testing.procs import proc_group
from narwhal_testing.temporal import SEARCH_ATTRIBUTE_KEYS, dev_server_path
from workflows.worker import build_worker


class TimedTransport(httpx.AsyncBaseTransport):
    """Records the wall time of each supervisor restart call (the engines' own restart time)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.restart_s: dict[str, float] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        t0 = time.perf_counter()
        resp = await self.inner.handle_async_request(request)
        if request.method == "POST" and request.url.path.endswith("/restart"):
            await resp.aread()
            self.restart_s[request.url.path.split("/")[2]] = time.perf_counter() - t0
        return resp


async def one(env: WorkflowEnvironment, mode: str, n: int) -> dict[str, float | int | str]:
    with tempfile.TemporaryDirectory() as tmp, proc_group(Path(tmp)) as group:
        stack = await asyncio.to_thread(
            start_stack, group, Path(tmp), n, "whole_wave" if mode == "wave" else "individual"
        )
        transport = TimedTransport()
        async with httpx.AsyncClient(transport=transport) as http:
            tq = f"bench-{uuid.uuid4().hex[:6]}"
            config = WorkerConfig(routers={"bench": RouterEntry(urls=[stack.router.url])})
            async with build_worker(env.client, tq, http, WorkerSettings.of(config)):
                plan = RestartPlan(
                    fleet=f"bench-{mode}-{n}-{uuid.uuid4().hex[:4]}", mode=mode,  # type: ignore[arg-type]
                    router=RouterRef(name="bench"),
                    supervisor=SupervisorRef(backend="local", url=stack.supervisor),
                    timing=Timing(poll_interval_s=0.2, heartbeat_timeout_s=5.0),
                )  # fmt: skip
                t0 = time.perf_counter()
                res: RestartResult = await env.client.execute_workflow(
                    "WaveRestart" if mode == "wave" else "RollingRestart",
                    plan,
                    id=f"narwhal-restart-{plan.fleet}",
                    task_queue=tq,
                    result_type=RestartResult,
                )
                wall = time.perf_counter() - t0
    assert res.ok, res.message
    drain = {i: e.timings.get("waiting_to_stop", 0.0) for i, e in res.engines.items()}
    restart = transport.restart_s
    engines_own = (
        sum(drain.values()) + sum(restart.values())
        if mode == "rolling"
        else max(drain.values()) + max(restart.values())
    )
    steps = 6 * n if mode == "rolling" else 6
    return {
        "mode": mode,
        "engines": n,
        "wall_s": round(wall, 2),
        "engines_own_s": round(engines_own, 2),
        "overhead_s": round(wall - engines_own, 2),
        "overhead_per_engine_s": round((wall - engines_own) / n, 3),
        "overhead_per_step_s": round((wall - engines_own) / steps, 3),
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8,32")
    ap.add_argument("--modes", default="rolling,wave")
    args = ap.parse_args()
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]), flush=True)
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=dev_server_path(),
        search_attributes=SEARCH_ATTRIBUTE_KEYS,
        data_converter=pydantic_data_converter,
        ui=False,
    )
    try:
        for n in (int(x) for x in args.sizes.split(",")):
            for mode in args.modes.split(","):
                print(json.dumps(await one(env, mode, n)), flush=True)
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
