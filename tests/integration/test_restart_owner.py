"""One restart owner per fleet and runs that tell the truth — real Temporal dev server, real router
processes, simulated engines under the local supervisor:

- a run waiting at its canary gate holds the fleet: a second CLI start, a start under another
  fleet name, a schedule firing and a direct Temporal client start restart nothing and are refused
  naming the running id; approve finishes the first run with each engine restarted exactly once; a
  run killed for good (terminated) frees the fleet; breaking the lock stops its owner at the gate;
- a worker without the control token fails the run in its first activity, one line in ``status``,
  in ``start --wait`` (no traceback) and in the UI's Current Details; the docs/vllm.md two-engine
  fleet (one prefill, one decode, unpinned) rolling-restarts;
- abort during a restart: the engine ends held, its line says ``restart aborted``, the run is
  Failed "aborted by NAME: reason".
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle

from narwhal_models.restart import RestartProgress, RestartResult, fleet_workflow_id
from tests.integration.conftest import Temporal, start_worker, wait_ready_line
from tests.integration.restart_support import (
    cli,
    engine_state,
    new_fleet,
    plan,
    progress,
    start,
    supervisor_restarts,
    until,
)
from tests.support.lifecycle import start_stack
from tests.support.procs import proc_group
from tests.support.worker_config import session_worker_config
from workflows.outcome import failure_line, final_result

pytestmark = pytest.mark.integration


async def ended(handle: WorkflowHandle[Any, Any]) -> WorkflowExecutionStatus | None:
    desc = await handle.describe()
    return None if desc.status == WorkflowExecutionStatus.RUNNING else desc.status


async def at_gate(handle: WorkflowHandle[Any, Any]) -> RestartProgress | None:
    try:
        p = await progress(handle)
    except Exception:  # not started yet
        return None
    return p if p.state == "waiting_operator" and p.fleet_lock else None


async def refusal_of(handle: WorkflowHandle[Any, Any]) -> str:
    with pytest.raises(WorkflowFailureError) as caught:
        await handle.result()
    return failure_line(caught.value)


async def test_one_owner_per_fleet_whatever_starts_the_second_run(
    temporal: Temporal, worker_queue: str, tmp_path: Path
) -> None:
    fleet = new_fleet("owner")
    wid = fleet_workflow_id(fleet)
    with proc_group(tmp_path) as group:
        s = start_stack(group, tmp_path, n=4)
        common = ["--router", s.router.url, "--supervisor-url", s.supervisor, "--task-queue", worker_queue,
                  "--poll-interval", "0.2"]  # fmt: skip
        first = cli(temporal, "start", *common, "--fleet", fleet, "--engines", "e0,e2", "--pause-after", "1")
        assert first.returncode == 0, first.stderr
        assert f"started {wid} run " in first.stdout and f"/workflows/{wid}" in first.stdout
        handle = temporal.client.get_workflow_handle(wid, result_type=RestartResult)
        p = await until("the canary gate", lambda: at_gate(handle), within=120)
        lock = p.fleet_lock
        assert supervisor_restarts(s.supervisor) == {"e0": 1, "e1": 0, "e2": 0, "e3": 0}

        # 1. the same CLI start again (same fleet name: the same workflow id)
        again = cli(temporal, "start", *common, "--fleet", fleet, "--engines", "e1")
        assert again.returncode == 2 and wid in again.stderr and "Traceback" not in again.stderr
        # 2. another fleet name for the same routers: a run starts, and refuses in its first steps
        other = new_fleet("alias")
        alias = cli(temporal, "start", *common, "--fleet", other, "--engines", "e1")
        assert alias.returncode == 2, alias.stdout + alias.stderr
        refused = alias.stderr.strip().splitlines()
        assert len(refused) == 1 and f"already being restarted by {wid} (waiting_operator" in refused[0]
        assert f"--workflow-id {wid}" in refused[0] and "nothing was drained" in refused[0]
        alias_handle = temporal.client.get_workflow_handle(fleet_workflow_id(other))
        assert (await alias_handle.describe()).status == WorkflowExecutionStatus.FAILED
        # 3. a schedule firing meanwhile
        name = f"nightly-{fleet}"
        created = cli(temporal, "schedule", "create", "--name", name, "--every", "1h", "--paused",
                      *common, "--fleet", new_fleet("sched"), "--engines", "e3")  # fmt: skip
        assert created.returncode == 0, created.stderr
        sched = temporal.client.get_schedule_handle(f"narwhal-schedule-{name}")
        await sched.trigger()

        async def scheduled_run() -> object:
            desc = await sched.describe()
            return desc.info.recent_actions[0].action.workflow_id if desc.info.recent_actions else None

        sched_handle = temporal.client.get_workflow_handle(
            str(await until("the scheduled run", scheduled_run))
        )
        await until("the scheduled run to end", lambda: ended(sched_handle), within=60)
        assert f"already being restarted by {wid}" in await refusal_of(sched_handle)
        await sched.delete()
        cron = f"weekly-{fleet}"
        made = cli(temporal, "schedule", "create", "--name", cron, "--cron", "0 3 * * SUN", "--paused",
                   *common, "--fleet", new_fleet("cron"), "--engines", "e3")  # fmt: skip
        assert made.returncode == 0, made.stderr
        rows = cli(temporal, "schedule", "list").stdout.splitlines()
        assert any(r.startswith(f"narwhal-schedule-{cron} ") and "cron 0 3 * * SUN" in r for r in rows), rows
        assert cli(temporal, "schedule", "delete", "--name", cron).returncode == 0
        missing = cli(temporal, "schedule", "pause", "--name", cron)
        assert missing.returncode == 2 and missing.stderr.strip().splitlines() == [
            f"refused: no schedule named {cron} (narwhal-schedule-{cron}); see `narwhal-restart schedule list`"
        ]
        # 4. a direct Temporal client, its own workflow id
        direct = await start(temporal, worker_queue, plan(new_fleet("direct"), [s.router.url], s.supervisor))
        assert f"already being restarted by {wid}" in await refusal_of(direct)
        assert (await direct.describe()).status == WorkflowExecutionStatus.FAILED
        assert supervisor_restarts(s.supervisor) == {"e0": 1, "e1": 0, "e2": 0, "e3": 0}  # nothing

        ans = cli(temporal, "approve", "--fleet", fleet, "--reason", "canary fine")
        assert ans.returncode == 0, ans.stderr
        res = await handle.result()
        assert res.ok and (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED
        assert supervisor_restarts(s.supervisor) == {"e0": 1, "e1": 0, "e2": 1, "e3": 0}  # exactly once
        late = cli(temporal, "approve", "--fleet", fleet)
        assert late.returncode == 2 and len(late.stderr.strip().splitlines()) == 1
        lock_handle = temporal.client.get_workflow_handle(lock)
        assert (
            await until("the lock released", lambda: ended(lock_handle)) == WorkflowExecutionStatus.COMPLETED
        )

        # a run killed for good frees its fleet: terminate it, the lock goes with it
        doomed = new_fleet("doomed")
        r = cli(temporal, "start", *common, "--fleet", doomed, "--engines", "e1,e3", "--pause-after", "1")
        assert r.returncode == 0, r.stderr
        doomed_handle = temporal.client.get_workflow_handle(fleet_workflow_id(doomed))
        p = await until("the second gate", lambda: at_gate(doomed_handle), within=120)
        await doomed_handle.terminate(reason="killed for good")
        lock_handle = temporal.client.get_workflow_handle(p.fleet_lock)
        assert await until("the lock gone", lambda: ended(lock_handle)) == WorkflowExecutionStatus.TERMINATED
        after = cli(temporal, "start", *common, "--fleet", new_fleet("after"), "--engines", "e3", "--wait")
        assert after.returncode == 0, after.stdout + after.stderr
        assert supervisor_restarts(s.supervisor) == {"e0": 1, "e1": 1, "e2": 1, "e3": 1}


async def test_breaking_the_lock_stops_its_owner_before_the_next_engine(
    temporal: Temporal, worker_queue: str, tmp_path: Path
) -> None:
    fleet = new_fleet("broken")
    with proc_group(tmp_path) as group:
        s = start_stack(group, tmp_path, n=4)
        r = cli(temporal, "start", "--router", s.router.url, "--supervisor-url", s.supervisor, "--fleet", fleet,
                "--engines", "e0,e2", "--pause-after", "1", "--task-queue", worker_queue, "--poll-interval", "0.2")  # fmt: skip
        assert r.returncode == 0, r.stderr
        handle = temporal.client.get_workflow_handle(fleet_workflow_id(fleet), result_type=RestartResult)
        p = await until("the canary gate", lambda: at_gate(handle), within=120)
        await temporal.client.get_workflow_handle(p.fleet_lock).terminate(reason="broken by hand")
        assert (
            await until("the owner to stop", lambda: ended(handle), within=60)
            == WorkflowExecutionStatus.FAILED
        )
        res = await final_result(handle)
        assert res.state == "aborted" and res.message.startswith(
            "aborted by Temporal: the fleet lock was broken"
        )
        assert supervisor_restarts(s.supervisor) == {"e0": 1, "e1": 0, "e2": 0, "e3": 0}


async def test_worker_without_the_token_fails_first_and_the_vllm_two_engine_fleet_rolls(
    temporal: Temporal, worker_queue: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_env = f"NARWHAL_OWNER_TOKEN_{uuid.uuid4().hex[:6].upper()}"
    monkeypatch.setenv(token_env, uuid.uuid4().hex)  # the router and the CLI have it; no worker does
    fleet = new_fleet("notoken")
    wid = fleet_workflow_id(fleet)
    with proc_group(tmp_path) as group:
        # docs/vllm.md §4: e0 prefill, e1 decode, unpinned, floors 1/1, a control token
        s = start_stack(group, tmp_path, n=2, extra={"control": {"token_env": token_env}})
        # the workers' configuration names the token variable; the session's worker lacks it
        name = session_worker_config().allow_routers([s.router.url], token_env=token_env)
        common = ["--router", s.router.url, "--worker-router", name, "--supervisor-url", s.supervisor,
                  "--control-token-env", token_env, "--poll-interval", "0.2"]  # fmt: skip
        r = cli(temporal, "start", *common, "--task-queue", worker_queue, "--fleet", fleet, "--wait")
        reason = f"preflight: router {name}: control token variable {token_env} is not set on the worker"
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stderr.strip() == reason and "Traceback" not in r.stdout + r.stderr
        handle = temporal.client.get_workflow_handle(wid)
        assert (await handle.describe()).status == WorkflowExecutionStatus.FAILED
        assert await refusal_of(handle) == reason
        status = cli(temporal, "status", "--fleet", fleet)
        assert status.returncode == 1 and f"failed — failed: {reason}" in status.stdout, status.stdout
        meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        assert reason in meta.current_details and "— failed" in meta.current_details
        assert supervisor_restarts(s.supervisor) == {"e0": 0, "e1": 0}
        assert engine_state(s.router.url, "e0") == "active"

        queue = f"tok-{uuid.uuid4().hex[:6]}"
        worker = start_worker(group, temporal, queue, name="token-worker")  # inherits the token
        wait_ready_line(worker)
        rolled = cli(
            temporal, "start", *common, "--task-queue", queue, "--fleet", new_fleet("vllm"), "--wait"
        )
        assert rolled.returncode == 0, rolled.stdout + rolled.stderr
        assert supervisor_restarts(s.supervisor) == {"e0": 1, "e1": 1}
        assert "e0" in rolled.stdout and "restarted" in rolled.stdout


async def test_abort_during_a_restart_ends_held_and_says_so(
    temporal: Temporal, worker_queue: str, tmp_path: Path
) -> None:
    fleet = new_fleet("abort")
    wid = fleet_workflow_id(fleet)
    with proc_group(tmp_path) as group:
        s = start_stack(group, tmp_path, n=2)
        # a restart command that returns at once without restarting: no newer process comes
        r = cli(temporal, "start", "--router", s.router.url, "--supervisor", "command", "--restart-template",
                session_worker_config().add_template("true"), "--engines", "e0", "--fleet", fleet, "--task-queue", worker_queue,
                "--poll-interval", "0.2", "--restart-timeout-s", "600")  # fmt: skip
        assert r.returncode == 0, r.stderr
        handle = temporal.client.get_workflow_handle(wid, result_type=RestartResult)

        async def waiting() -> object:
            p = await progress(handle)
            return p if p.engines["e0"].step == "waiting_for_new_process" else None

        await until("e0 waiting for its newer process", waiting, within=120)
        ans = cli(temporal, "abort", "--fleet", fleet, "--reason", "wrong build", "--requested-by", "alice")
        assert ans.returncode == 0 and "e0 stop at the next safe point" in ans.stdout, ans.stdout + ans.stderr
        assert (
            await until("the run to end", lambda: ended(handle), within=60) == WorkflowExecutionStatus.FAILED
        )
        res = await final_result(handle)
        assert res.state == "aborted" and res.message.startswith("aborted by alice: wrong build")
        e0 = res.engines["e0"]
        assert e0.outcome == "aborted" and e0.new_process_start is None
        assert "restart aborted while waiting for its newer process" in e0.note
        assert engine_state(s.router.url, "e0") == "drained"  # held, never readmitted
        status = cli(temporal, "status", "--fleet", fleet)
        assert status.returncode == 1, status.stdout
        line = next(x for x in status.stdout.splitlines() if x.strip().startswith("e0 "))
        assert "aborted: restart aborted" in line and "restarted in" not in line, line
