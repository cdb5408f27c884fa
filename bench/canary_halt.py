"""Canary analysis: time from a bad engine's readmission to the halt, and what clients lost meanwhile.

A real Temporal dev server, an in-process worker, a real router, four simulated engines under the
local supervisor and steady client load (4 closed-loop clients). A bad build is staged on every
engine (``failing``: 20 % of requests answer 500; ``slow``: 3× the time to first token) and a
rolling restart runs with canary analysis. Reported per run:

- ``halt_s`` — from e0's readmission (its restart step ``done``) to the hold (drained again);
- ``samples`` — analysis windows judged until the verdict;
- ``canary_legs_failed`` — legs the bad engine failed between readmission and hold (the router's
  per-engine counters; the router retried them on another engine while no output had reached the
  client);
- ``client_failed`` / ``client_served`` — what the clients saw during the whole run.

    .venv/bin/python bench/canary_halt.py [--builds failing,slow] [--runs 3] [--bake 2] [--interval 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import httpx
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleet.up.stack import bad_builds
from narwhal_models.evidence import AnalysisPolicy
from narwhal_models.restart import RestartPlan, RestartResult, RouterRef, SupervisorRef, Timing
from narwhal_testing import loopback
from narwhal_testing.lifecycle import client_load, start_stack, wait_for
from narwhal_testing.procs import proc_group
from narwhal_testing.temporal import SEARCH_ATTRIBUTE_KEYS, dev_server_path
from workflows.worker import build_worker

TTFT_MS = 30.0


def _failed_legs(router_url: str, iid: str) -> int:
    ev = loopback.get(f"{router_url}/narwhal/state", timeout=10).json()["engine_evidence"][iid]
    return sum(sum(ev[leg]["failed"].values()) for leg in ("prefill", "decode"))


async def one(env: WorkflowEnvironment, build: str, policy: AnalysisPolicy) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, proc_group(Path(tmp)) as group:
        stack = await asyncio.to_thread(
            start_stack, group, Path(tmp), 4, ttft_base_ms=TTFT_MS, builds=bad_builds(TTFT_MS)
        )
        for sim in stack.sims:
            loopback.post(f"{stack.supervisor}/engines/{sim.iid}/build", json={"build": build}, timeout=10)
        async with httpx.AsyncClient() as http:
            tq = f"bench-{uuid.uuid4().hex[:6]}"
            async with build_worker(env.client, tq, http):
                plan = RestartPlan(
                    fleet=f"bench-canary-{uuid.uuid4().hex[:6]}",
                    router=RouterRef(routers=[stack.router.url]),
                    supervisor=SupervisorRef(backend="local", url=stack.supervisor),
                    timing=Timing(poll_interval_s=0.2, heartbeat_timeout_s=5.0),
                    analysis=policy,
                )
                with client_load(stack.router.url) as load:
                    await asyncio.to_thread(wait_for, "client traffic", lambda: load.ok >= 10)
                    failed_before = _failed_legs(stack.router.url, "e0")
                    res: RestartResult = await env.client.execute_workflow(
                        "RollingRestart", plan, id=f"narwhal-restart-{plan.fleet}", task_queue=tq,
                        result_type=RestartResult,
                    )  # fmt: skip
                    failed_after = _failed_legs(stack.router.url, "e0")
    e0 = res.engines["e0"]
    readmitted = e0.step_times.get("done")
    halted = e0.finished_at if res.state == "analysis_failed" else None
    return {
        "build": build,
        "state": res.state,
        "halt_s": round(halted - readmitted, 2) if halted is not None and readmitted is not None else None,
        "samples": len([s for s in res.analysis if s.engines == ["e0"]]),
        "canary_legs_failed": failed_after - failed_before,
        "client_served": load.ok,
        "client_failed": len(load.failed),
        "engines_restarted": sorted(i for i, e in res.engines.items() if e.new_process_start is not None),
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--builds", default="failing,slow")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--bake", type=float, default=2.0)
    ap.add_argument("--interval", type=float, default=5.0)
    args = ap.parse_args()
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]), flush=True)
    policy = AnalysisPolicy(
        bake_s=args.bake, interval_s=args.interval, samples=2, min_requests=10, max_ttft_ratio=1.8,
        failure_limit=1, inconclusive_limit=3,
    )  # fmt: skip
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=dev_server_path(),
        search_attributes=SEARCH_ATTRIBUTE_KEYS,
        data_converter=pydantic_data_converter,
        ui=False,
    )
    try:
        for build in args.builds.split(","):
            rows = [await one(env, build, policy) for _ in range(args.runs)]
            for row in rows:
                print(json.dumps(row), flush=True)
            halts = [r["halt_s"] for r in rows if r["halt_s"] is not None]
            summary = {
                "build": build,
                "runs": len(rows),
                "halted": len(halts),
                "halt_s_median": statistics.median(halts) if halts else None,
                "halt_s_max": max(halts) if halts else None,
                "canary_legs_failed_median": statistics.median(r["canary_legs_failed"] for r in rows),
                "client_failed_total": sum(r["client_failed"] for r in rows),
            }
            print(json.dumps({"summary": summary}), flush=True)
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
