"""Restart workflows end to end: Temporal dev server, real ``narwhal-worker`` processes, real router,
simulated engines under the local supervisor, ``narwhal-restart`` as a subprocess."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle

from narwhal_models.restart import RestartProgress, RestartResult, fleet_workflow_id
from tests.integration.conftest import Temporal, start_worker, wait_ready_line
from tests.integration.restart_support import (
    cli,
    engine_state,
    lifecycle,
    new_fleet,
    plan,
    progress,
    start,
    supervisor_restarts,
    until,
)
from tests.support.fleet import process_start, reset_faults
from tests.support.lifecycle import client_load, start_stack, wait_for
from tests.support.procs import proc_group
from tests.support.worker_config import session_worker_config
from workflows.outcome import final_result

pytestmark = pytest.mark.integration


def assert_all_restarted(res: RestartResult, before: dict[str, float]) -> None:
    assert res.ok, res.message
    assert sorted(res.engines) == sorted(before)
    for iid, e in res.engines.items():
        assert e.outcome == "restarted", (iid, e)
        assert e.old_process_start == pytest.approx(before[iid])
        assert e.new_process_start is not None and e.new_process_start > before[iid]


async def test_rolling_restart_under_load_pause_resume_and_second_start_refused(
    temporal: Temporal, worker_queue: str, tmp_path: Path
) -> None:
    fleet = new_fleet("roll")
    wid = fleet_workflow_id(fleet)
    with proc_group(tmp_path) as group:
        s = start_stack(group, tmp_path, n=4, itl_ms=10)
        before = {sim.iid: process_start(sim.url) for sim in s.sims}
        common = ["--router", s.router.url, "--supervisor-url", s.supervisor, "--fleet", fleet]
        with client_load(s.router.url) as load:
            wait_for("client traffic", lambda: load.ok >= 8)
            r = cli(temporal, "start", *common, "--task-queue", worker_queue, "--poll-interval", "0.2")
            assert r.returncode == 0, r.stderr
            assert f"started {wid}" in r.stdout and "UI: http" in r.stdout
            assert cli(temporal, "pause", "--fleet", fleet).returncode == 0
            handle = temporal.client.get_workflow_handle(wid, result_type=RestartResult)
            p = await until("paused between engines", lambda: _paused_between_engines(handle))
            # the pause took effect between engines: in the workflow's history no engine restart was
            # started after the pause signal (whichever engine was in flight when it arrived finished)
            assert [ev.kind for ev in p.events] == ["paused"]
            assert await _children_started_after_pause(handle) == []
            touched = {i for i, e in p.engines.items() if e.step != "pending"}
            assert len(touched) < len(before)
            restarts = supervisor_restarts(s.supervisor)
            second = cli(temporal, "start", *common, "--engines", "e3", "--task-queue", worker_queue)
            assert second.returncode == 2 and f"already running ({wid})" in second.stderr
            status = cli(temporal, "status", "--fleet", fleet, "--json")
            assert json.loads(status.stdout)["state"] == "paused"
            # still paused after those round trips: nothing else was drained or restarted meanwhile
            again = await progress(handle)
            assert {i for i, e in again.engines.items() if e.step != "pending"} == touched
            assert supervisor_restarts(s.supervisor) == restarts
            assert all(engine_state(s.router.url, i) == "active" for i in before)
            assert cli(temporal, "resume", "--fleet", fleet).returncode == 0
            res = await handle.result()
            served = load.ok
            wait_for("traffic after the rollout", lambda: load.ok >= served + 8)
        assert load.failed == [], load.failed[:5]
        assert_all_restarted(res, before)
        assert supervisor_restarts(s.supervisor) == {iid: 1 for iid in before}
        doc = lifecycle(s.router.url)
        for iid, e in doc["engines"].items():
            assert e["state"] == "active" and e["accepts_new"], (iid, e)
            assert "new process identity" in e["checks"] and e["checks"][-1] == "final health"
            assert e["new_process_start"] == pytest.approx(res.engines[iid].new_process_start)
        listed = cli(temporal, "list", "--fleet", fleet)
        row = next(line for line in listed.stdout.splitlines() if line.startswith(wid))
        assert " completed " in row and " done " in row, listed.stdout


async def _children_started_after_pause(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """Engine restarts started by a workflow task that had seen the pause (a task already running
    when the signal arrived may still start one: its commands land after the signal event)."""
    history = await handle.fetch_history()
    after: list[str] = []
    paused = seen = False
    for ev in history.events:
        if ev.HasField("workflow_execution_signaled_event_attributes"):
            paused = paused or ev.workflow_execution_signaled_event_attributes.signal_name == "pause"
        elif paused and ev.HasField("workflow_task_started_event_attributes"):
            seen = True  # this task and every later one know about the pause
        elif seen and ev.HasField("start_child_workflow_execution_initiated_event_attributes"):
            after.append(ev.start_child_workflow_execution_initiated_event_attributes.workflow_id)
    assert paused, "no pause signal in the history"
    return after


async def _paused_between_engines(handle: WorkflowHandle[Any, Any]) -> RestartProgress | None:
    """The workflow waits in its pause: it says so only once no batch is in flight (an engine whose
    restart was started before the pause, and has not reported yet, still shows as pending)."""
    p = await progress(handle)
    return (
        p
        if p.state == "paused"
        and p.message == "paused between engines"
        and all(e.outcome in ("pending", "restarted") for e in p.engines.values())
        else None
    )


async def test_whole_wave_restart_withdraws_and_restores_ready(
    temporal: Temporal, worker_queue: str, tmp_path: Path
) -> None:
    with proc_group(tmp_path) as group:
        s = start_stack(group, tmp_path, n=3, policy="whole_wave")
        before = {sim.iid: process_start(sim.url) for sim in s.sims}
        seen: set[int] = set()
        stop = threading.Event()

        def watch_ready() -> None:
            while not stop.is_set():
                seen.add(s.router.get("/ready").status_code)

        watcher = threading.Thread(target=watch_ready, daemon=True)
        watcher.start()
        try:
            fleet = new_fleet("wave")
            r = cli(
                temporal, "start", "--router", s.router.url, "--supervisor-url", s.supervisor, "--fleet", fleet,
                "--task-queue", worker_queue, "--poll-interval", "0.2", "--wait",
            )  # fmt: skip
        finally:
            stop.set()
            watcher.join(5)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "(wave" in r.stdout  # mode defaulted from engine_restart_policy whole_wave
        res = await temporal.client.get_workflow_handle(
            fleet_workflow_id(fleet), result_type=RestartResult
        ).result()
        assert_all_restarted(res, before)
        assert 503 in seen and s.router.get("/ready").status_code == 200
        doc = lifecycle(s.router.url)
        assert not doc["wave"]["active"] and all(e["state"] == "active" for e in doc["engines"].values())
        assert supervisor_restarts(s.supervisor) == {iid: 1 for iid in before}


async def test_worker_killed_mid_restart_resumes_without_double_restart(
    temporal: Temporal, tmp_path: Path
) -> None:
    queue = f"kill9-{new_fleet('q')}"
    with proc_group(tmp_path) as group:
        s = start_stack(group, tmp_path, n=4)
        before = {sim.iid: process_start(sim.url) for sim in s.sims}
        first = start_worker(group, temporal, queue, name="worker-a")
        wait_ready_line(first)
        handle = await start(temporal, queue, plan(new_fleet("kill"), [s.router.url], s.supervisor))
        await until("e1 in progress", lambda: engine_state(s.router.url, "e1") != "active")
        first.kill9()
        second = start_worker(group, temporal, queue, name="worker-b")
        wait_ready_line(second)
        res = await handle.result()
        assert_all_restarted(res, before)
        assert supervisor_restarts(s.supervisor) == {iid: 1 for iid in before}


RESTART_WITH_FAULT = """
import sys, httpx
sup, iid, url = sys.argv[1:4]
httpx.post(f"{sup}/engines/{iid}/restart", json={}, timeout=60).raise_for_status()
httpx.post(f"{url}/sim/faults", json={"wrong_model": "other-model"}, timeout=5).raise_for_status()
"""


@pytest.mark.parametrize("decision", ["retry", "abort"])
async def test_restarted_engine_failing_validation_waits_for_the_operator(
    temporal: Temporal, worker_queue: str, tmp_path: Path, decision: str
) -> None:
    helper = tmp_path / "restart_with_fault.py"
    helper.write_text(RESTART_WITH_FAULT)
    with proc_group(tmp_path) as group:
        s = start_stack(group, tmp_path, n=3)
        fleet = new_fleet(decision)
        command = f"{sys.executable} {helper} {s.supervisor} {{iid}} {{url}}"
        r = cli(
            temporal, "start", "--router", s.router.url, "--engines", "e1", "--fleet", fleet,
            "--supervisor", "command", "--restart-template", session_worker_config().add_template(command),
            "--engine-url", f"e1={s.url('e1')}",
            "--task-queue", worker_queue, "--poll-interval", "0.2",
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        handle = temporal.client.get_workflow_handle(fleet_workflow_id(fleet), result_type=RestartResult)

        async def blocked() -> object:
            p = await progress(handle)
            e1 = p.engines.get("e1")
            return p if e1 is not None and e1.step == "blocked" else None

        p = await until("e1 blocked", blocked)
        assert p.state == "waiting_operator" and "expected sim-model" in p.engines["e1"].error
        view = lifecycle(s.router.url)["engines"]["e1"]
        assert view["state"] == "blocked" and not view["accepts_new"]  # never forced back
        refused = cli(temporal, "approve", "--fleet", fleet)
        assert refused.returncode == 2
        if decision == "retry":
            reset_faults(s.url("e1"))  # the repair
            ans = cli(temporal, "retry", "--fleet", fleet, "--reason", "fault cleared")
            assert ans.returncode == 0 and "retry applied to e1" in ans.stdout
            res = await handle.result()
            assert res.ok and res.engines["e1"].outcome == "restarted"
            assert engine_state(s.router.url, "e1") == "active"
        else:
            ans = cli(temporal, "abort", "--fleet", fleet, "--reason", "give up")
            assert ans.returncode == 0, ans.stderr
            res = await final_result(handle)
            assert not res.ok and res.state == "aborted" and res.engines["e1"].outcome == "aborted"
            assert res.message.startswith("aborted by ") and "give up" in res.message
            assert (await handle.describe()).status == WorkflowExecutionStatus.FAILED  # status = outcome
            status = cli(temporal, "status", "--fleet", fleet)
            assert status.returncode == 1 and " failed — aborted: aborted by " in status.stdout, status.stdout
            assert engine_state(s.router.url, "e1") == "blocked"
        assert supervisor_restarts(s.supervisor)["e1"] == 1
