"""Record workflow histories for the replay tests (tests/unit/restart/test_replay.py).

Runs a few representative scenarios on the time-skipping test server (offline) with the fake
activities of narwhal_testing/restart_fakes.py and writes every workflow's history — the parent
RollingRestart/WaveRestart and each child EngineRestart — to
``tests/fixtures/histories/<workflow id>.json`` (``WorkflowHistory.to_json()`` re-serialised one
event per line; the file name is the workflow id, which ``to_json`` leaves out).

Re-record only on purpose: the committed files are the histories that *old* workers wrote, and
replaying them against the current workflow code is what catches a nondeterministic change. A
change that must alter the command sequence goes behind ``workflow.patched(...)``; record a new
scenario for the new path and keep the old files (the first five scenarios predate the
``exactly-once-launch`` patch; ``exactly-once``, ``wave-exactly-once`` and ``canary`` record it;
the ``owner-*`` scenarios record the ``fleet-owner`` path: preflight, fleet lock, status = outcome;
``analysis`` records the canary analysis steps of ``--analysis``).

    .venv/bin/python scripts/record_histories.py [--out DIR] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from temporalio.client import WorkflowFailureError, WorkflowHandle  # noqa: E402
from temporalio.testing import WorkflowEnvironment  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

from narwhal_models.evidence import AnalysisPolicy  # noqa: E402
from narwhal_models.restart import (  # noqa: E402
    FLEET_LOCK_PREFIX,
    OperatorAnswer,
    OperatorRequest,
    RestartPlan,
    RestartResult,
    RouterRef,
    SupervisorRef,
    Timing,
    engine_workflow_id,
    fleet_lock_id,
    fleet_workflow_id,
)
from narwhal_testing.restart_fakes import FakeFleet  # noqa: E402
from narwhal_testing.temporal import start_time_skipping, until_progress  # noqa: E402
from workflows.outcome import final_result  # noqa: E402
from workflows.restart import EngineRestart, FleetLock, RollingRestart, WaveRestart  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "histories"
TASK_QUEUE = "record-histories"

Handle = WorkflowHandle[Any, RestartResult]


def plan(fleet: str, **kw: Any) -> RestartPlan:
    return RestartPlan(
        fleet=fleet,
        router=RouterRef(routers=["http://fake"]),
        supervisor=SupervisorRef(backend="local", url="http://sup"),
        timing=Timing(poll_interval_s=0.1, heartbeat_timeout_s=1.0),
        **kw,
    )


async def start(env: WorkflowEnvironment, p: RestartPlan) -> Handle:
    wf = WaveRestart.run if p.mode == "wave" else RollingRestart.run
    return await env.client.start_workflow(wf, p, id=fleet_workflow_id(p.fleet), task_queue=TASK_QUEUE)


async def finish(handle: Handle) -> RestartResult:
    res = await asyncio.wait_for(handle.result(), 30)
    if not res.ok:
        raise RuntimeError(f"{handle.id} did not succeed: {res.state} {res.message}")
    return res


# -- scenarios: each runs one fleet to a successful end and returns its plan ----------------------


async def rolling(env: WorkflowEnvironment, fleet: FakeFleet) -> RestartPlan:
    """Rolling restart of two engines, one at a time, both restarted and readmitted."""
    p = plan("rolling")
    await finish(await start(env, p))
    return p


async def readmit_retry(env: WorkflowEnvironment, fleet: FakeFleet) -> RestartPlan:
    """e0's readmission is refused (engine blocked, waits for the operator), then ``retry``."""
    fleet.fail_readmit.add("e0")
    p = plan("readmit-retry")
    h = await start(env, p)
    await until_progress(h, lambda p: p.engines["e0"].step == "blocked")
    fleet.fail_readmit.clear()
    await h.execute_update("retry", OperatorRequest(by="bob"), result_type=OperatorAnswer)
    await finish(h)
    return p


async def wave(env: WorkflowEnvironment, fleet: FakeFleet) -> RestartPlan:
    """Whole-wave restart; one identity-capture failure → start that engine and repeat the drain."""
    fleet.capture_fail_once.add("e1")
    p = plan("wave", mode="wave")
    await finish(await start(env, p))
    return p


async def pause_resume(env: WorkflowEnvironment, fleet: FakeFleet) -> RestartPlan:
    """``pause`` while e0 is being readmitted (takes effect between engines), then ``resume``."""
    fleet.readmit_gate = asyncio.Event()
    p = plan("pause-resume")
    h = await start(env, p)
    await asyncio.wait_for(fleet.readmit_entered.wait(), 10)
    await h.signal("pause")
    fleet.readmit_gate.set()
    await until_progress(h, lambda p: p.engines["e0"].outcome == "restarted" and p.state == "paused")
    await h.signal("resume")
    await finish(h)
    return p


async def restart_timeout_retry(env: WorkflowEnvironment, fleet: FakeFleet) -> RestartPlan:
    """No newer process within the restart timeout → blocked (``workflow.patched`` path) → ``retry``."""
    fleet.never_back.add("e0")
    p = plan("restart-timeout-retry")
    p = p.model_copy(update={"timing": p.timing.model_copy(update={"new_process_timeout_s": 2.0})})
    h = await start(env, p)
    await until_progress(h, lambda p: p.engines["e0"].step == "blocked")
    fleet.never_back.clear()
    await h.execute_update("retry", OperatorRequest(by="bob"), result_type=OperatorAnswer)
    await finish(h)
    return p


async def exactly_once(env: WorkflowEnvironment, fleet: FakeFleet) -> RestartPlan:
    """The exactly-once launch path (``workflow.patched("exactly-once-launch")``): e0's restart
    attempt is lost after it reported its launch (not repeated), e1's before (launched again)."""
    fleet.lose_launch.update({"e0": "after", "e1": "before"})
    p = plan("exactly-once")
    await finish(await start(env, p))
    return p


async def wave_exactly_once(env: WorkflowEnvironment, fleet: FakeFleet) -> RestartPlan:
    """Whole wave on the exactly-once path; e1 already runs a newer process (not launched)."""
    fleet.lose_launch["e1"] = "external"
    p = plan("wave-exactly-once", mode="wave")
    await finish(await start(env, p))
    return p


async def canary(env: WorkflowEnvironment, fleet: FakeFleet) -> RestartPlan:
    """Canary gate after one engine (``pause_after=1``), released with ``approve``."""
    p = plan("canary", pause_after=1)
    h = await start(env, p)
    await until_progress(h, lambda p: p.state == "waiting_operator")
    await h.execute_update("approve", OperatorRequest(by="bob"), result_type=OperatorAnswer)
    await finish(h)
    return p


async def owner_canary(env: WorkflowEnvironment, fleet: FakeFleet) -> RestartPlan:
    """The ``fleet-owner`` path: preflight, the fleet lock, a canary gate; meanwhile a second run on
    the same fleet (another name) is refused (``FleetBusy``); approve; the lock is released."""
    p = plan("owner-canary", pause_after=1)
    h = await start(env, p)
    await until_progress(h, lambda p: p.state == "waiting_operator")
    refused = await start(env, plan("owner-refused"))
    try:
        await asyncio.wait_for(refused.result(), 30)
    except WorkflowFailureError:
        pass
    else:
        raise RuntimeError("the second run was not refused")
    await h.execute_update("approve", OperatorRequest(by="bob"), result_type=OperatorAnswer)
    await finish(h)
    return p


async def owner_abort(env: WorkflowEnvironment, fleet: FakeFleet) -> RestartPlan:
    """``fleet-owner`` path, aborted while e0 waits for its newer process: the run fails."""
    fleet.never_back.add("e0")
    p = plan("owner-abort")
    h = await start(env, p)
    await until_progress(h, lambda p: p.engines["e0"].step == "waiting_for_new_process")
    await h.execute_update("abort", OperatorRequest(by="bob", reason="bad"), result_type=OperatorAnswer)
    res = await asyncio.wait_for(final_result(h), 30)
    if res.state != "aborted":
        raise RuntimeError(f"{h.id}: expected aborted, got {res.state}")
    return p


async def owner_wave(env: WorkflowEnvironment, fleet: FakeFleet) -> RestartPlan:
    """Whole wave on the ``fleet-owner`` path."""
    p = plan("owner-wave", mode="wave")
    await finish(await start(env, p))
    return p


async def analysis(env: WorkflowEnvironment, fleet: FakeFleet) -> RestartPlan:
    """Canary analysis after each engine (bake, two sample windows), every sample passing."""
    p = plan("analysis", engines=["e0", "e1"], analysis=AnalysisPolicy(bake_s=5, interval_s=10, samples=2))
    await finish(await start(env, p))
    return p


Scenario = Callable[[WorkflowEnvironment, FakeFleet], Awaitable[RestartPlan]]
SCENARIOS: dict[str, tuple[list[str], Scenario]] = {
    "rolling": (["prefill", "prefill"], rolling),
    "readmit-retry": (["prefill", "prefill"], readmit_retry),
    "wave": (["prefill", "decode"], wave),
    "pause-resume": (["prefill", "prefill"], pause_resume),
    "restart-timeout-retry": (["prefill", "prefill"], restart_timeout_retry),
    "exactly-once": (["prefill", "prefill"], exactly_once),
    "wave-exactly-once": (["prefill", "decode"], wave_exactly_once),
    "canary": (["prefill", "prefill"], canary),
    "owner-canary": (["prefill", "prefill"], owner_canary),
    "owner-abort": (["prefill", "prefill"], owner_abort),
    "owner-wave": (["prefill", "decode"], owner_wave),
    "analysis": (["prefill", "prefill", "prefill"], analysis),
}
# scenarios whose runs take the fleet lock (its history and a refused run's are recorded too)
EXTRA_RUNS = {"owner-canary": ["owner-refused"]}


def compact(history_json: str) -> str:
    """One event per line: ~70 % of ``to_json()``'s indented size, still line-diffable."""
    events = json.loads(history_json)["events"]
    lines = ",\n".join(json.dumps(e, separators=(",", ":")) for e in events)
    return '{"events":[\n' + lines + "\n]}\n"


async def record(only: list[str]) -> dict[str, str]:
    """Run the scenarios; returns {workflow id: history file text}."""
    env = await start_time_skipping()
    histories: dict[str, str] = {}
    try:
        for name, (roles, scenario) in SCENARIOS.items():
            if only and name not in only:
                continue
            fleet = FakeFleet.of(roles)
            async with Worker(
                env.client,
                task_queue=TASK_QUEUE,
                workflows=[EngineRestart, RollingRestart, WaveRestart, FleetLock],
                activities=fleet.activities(),
            ):
                p = await scenario(env, fleet)
            ids = [fleet_workflow_id(p.fleet)] + [fleet_workflow_id(f) for f in EXTRA_RUNS.get(name, [])]
            if p.mode != "wave":  # the engines that ran (an aborted rollout leaves the rest pending)
                started = {c.split()[1] for c in fleet.calls if c.startswith("drain ")}
                ids += [engine_workflow_id(p.fleet, iid) for iid in sorted(fleet.engines) if iid in started]
            if name.startswith("owner-"):
                lock = fleet_lock_id(fleet.identity)
                histories[f"{FLEET_LOCK_PREFIX}{name}"] = compact(
                    (await env.client.get_workflow_handle(lock).fetch_history()).to_json()
                )
            for wid in ids:
                history = await env.client.get_workflow_handle(wid).fetch_history()
                histories[wid] = compact(history.to_json())
    finally:
        await env.shutdown()
    return histories


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--out", type=Path, default=OUT, help="directory for the JSON files (default: %(default)s)"
    )
    ap.add_argument("--only", nargs="*", default=[], choices=sorted(SCENARIOS), help="record only these")
    args = ap.parse_args()
    # the fakes' poll-by-retry (NotReadyYet) failures are expected: keep the output readable
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("temporalio.activity").setLevel(logging.ERROR)
    histories = asyncio.run(record(args.only))
    args.out.mkdir(parents=True, exist_ok=True)
    for wid, text in histories.items():
        path = args.out / f"{wid}.json"
        path.write_text(text)
        print(f"{path}: {len(text)} bytes, {text.count(chr(10)) - 2} events")


if __name__ == "__main__":
    main()
