"""What an operator does with ``narwhal-restart`` against the real stack and the Temporal dev server:
a canary gate (``--pause-after``) released from the CLI, ``--follow`` printing operator events,
``status`` without ``--fleet``, ``list`` with run ids and times, and restart waves on a Temporal
Schedule (create, list, pause, unpause, a triggered run, delete)."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus

from narwhal_models.restart import RestartResult, fleet_workflow_id
from tests.integration.conftest import Temporal
from tests.integration.restart_support import (
    cli,
    new_fleet,
    progress,
    supervisor_restarts,
    until,
    worker_routers,
)
from tests.support.lifecycle import start_stack
from tests.support.procs import proc_group, script

pytestmark = pytest.mark.integration


async def test_canary_gate_waits_for_the_operator_and_the_cli_shows_it(
    temporal: Temporal, worker_queue: str, tmp_path: Path
) -> None:
    fleet = new_fleet("canary")
    wid = fleet_workflow_id(fleet)
    with proc_group(tmp_path) as group:
        s = start_stack(group, tmp_path, n=4)
        follow = group.start(
            "follow",
            [script("narwhal-restart"), "start", "--address", temporal.address, "--router", s.router.url,
             "--supervisor-url", s.supervisor, "--fleet", fleet, "--engines", "e0,e2", "--pause-after", "1",
             "--task-queue", worker_queue, "--poll-interval", "0.2", "--follow",
             *worker_routers(["--router", s.router.url])],
        )  # fmt: skip
        try:
            handle = temporal.client.get_workflow_handle(wid, result_type=RestartResult)

            async def at_gate() -> object:
                try:
                    p = await progress(handle)
                except Exception:  # not started yet
                    return None
                return p if p.state == "waiting_operator" else None

            p = await until("the canary gate", at_gate, within=120)
            assert p.engines["e0"].outcome == "restarted" and p.engines["e2"].step == "pending"
            assert supervisor_restarts(s.supervisor)["e2"] == 0

            status = cli(temporal, "status")  # no --fleet: the only running restart
            assert status.returncode == 0, status.stderr
            assert f"{wid} (run " in status.stdout and "waiting operator" in status.stdout
            assert "1/2 restarted" in status.stdout and "elapsed" in status.stdout
            assert "waiting for operator" in status.stdout and "canary gate" in status.stdout

            refused = cli(temporal, "retry", "--fleet", fleet)
            assert refused.returncode == 2 and "retry" in refused.stderr
            ans = cli(temporal, "approve", "--fleet", fleet, "--reason", "canary looks good")
            assert ans.returncode == 0 and "canary gate approved" in ans.stdout, ans.stderr
            res = await handle.result()
            await until("narwhal-restart --follow to exit", lambda: not follow.alive(), within=60)
        finally:
            follow.stop()
        out = follow.log_path.read_text(errors="replace")
        assert follow.popen.returncode == 0, out
        assert res.ok and supervisor_restarts(s.supervisor)["e2"] == 1
        assert [ev.kind for ev in res.events] == ["waiting_for_operator", "approved"]
        assert "** " in out and "waiting for operator: canary gate after 1 engine(s)" in out
        assert "approved" in out and "canary looks good" in out
        assert "process started" in out and "UTC →" in out  # the summary in human times
        assert "1796" not in out.split("UTC →")[0][-40:]  # no raw epoch next to it

        listed = cli(temporal, "list", "--fleet", fleet)
        header, row = listed.stdout.splitlines()[:2]
        assert header.split()[:4] == ["WORKFLOW", "ID", "RUN", "ID"] and "ENDED (UTC)" in header
        desc = await handle.describe()
        assert row.startswith(wid) and desc.run_id in row and "completed" in row and "done" in row
        assert row.count("-") >= 4 and row.count(":") == 4  # start and end times, both present

        none_running = cli(temporal, "status")
        assert none_running.returncode == 2 and "no restart is running" in none_running.stderr


async def test_restart_waves_on_a_temporal_schedule(
    temporal: Temporal, worker_queue: str, tmp_path: Path
) -> None:
    fleet = new_fleet("sched")
    name = f"nightly-{fleet}"
    with proc_group(tmp_path) as group:
        s = start_stack(group, tmp_path, n=3)
        created = cli(
            temporal, "schedule", "create", "--name", name, "--every", "1h", "--paused", "--router", s.router.url,
            "--supervisor-url", s.supervisor, "--fleet", fleet, "--engines", "e1", "--task-queue", worker_queue,
            "--poll-interval", "0.2", "--note", "test schedule",
        )  # fmt: skip
        assert created.returncode == 0, created.stderr
        sid = f"narwhal-schedule-{name}"
        assert f"created {sid}" in created.stdout and "overlapping runs are skipped" in created.stdout
        again = cli(temporal, "schedule", "create", "--name", name, "--every", "1h", "--router", s.router.url,
                    "--supervisor-url", s.supervisor, "--fleet", fleet)  # fmt: skip
        assert again.returncode == 2 and "already exists" in again.stderr

        handle = temporal.client.get_schedule_handle(sid)
        desc = await handle.describe()
        assert desc.schedule.state.paused and desc.schedule.policy.overlap.name == "SKIP"
        assert desc.schedule.spec.intervals[0].every.total_seconds() == 3600

        async def listed_as(state: str) -> bool:
            out = cli(temporal, "schedule", "list").stdout
            return any(line.startswith(sid) and f" {state} " in line for line in out.splitlines())

        await until("the schedule listed as paused", lambda: listed_as("paused"))
        assert cli(temporal, "schedule", "unpause", "--name", name).returncode == 0
        await until("the schedule listed as active", lambda: listed_as("active"))

        await handle.trigger()  # a run now, as the interval would start it

        async def scheduled_run() -> object:
            q = f"WorkflowType = 'RollingRestart' AND NarwhalFleet = '{fleet}'"
            runs = [wf async for wf in temporal.client.list_workflows(q)]
            return runs[0] if runs and runs[0].status == WorkflowExecutionStatus.COMPLETED else None

        run = await until("the scheduled restart to complete", scheduled_run, within=180)
        assert run.id.startswith(fleet_workflow_id(fleet) + "-")  # Temporal appends the scheduled time
        res = await temporal.client.get_workflow_handle(run.id, result_type=RestartResult).result()
        assert res.ok and res.engines["e1"].outcome == "restarted"
        assert supervisor_restarts(s.supervisor) == {"e0": 0, "e1": 1, "e2": 0}

        assert cli(temporal, "schedule", "pause", "--name", name).returncode == 0
        await until("paused again", lambda: listed_as("paused"))
        assert cli(temporal, "schedule", "delete", "--name", name).returncode == 0
        assert sid not in cli(temporal, "schedule", "list").stdout
