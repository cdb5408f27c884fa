"""Replay the recorded histories (tests/fixtures/histories) against the current workflow code.

A change to EngineRestart/RollingRestart/WaveRestart that alters the command sequence an old
history produced (an added, removed or reordered activity, timer, child, signal…) fails here —
such a change must go behind ``workflow.patched(...)``. The histories are
written by ``scripts/record_histories.py``; the file name is the workflow id.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from narwhal_models.restart import RestartPlan, RestartResult
from workflows.owner import PATCH_FLEET_OWNER
from workflows.restart import EngineRestart, FleetLock, RollingRestart, WaveRestart
from workflows.steps import FLEET_KEY, PATCH_EXACTLY_ONCE_LAUNCH

HISTORIES = Path(__file__).resolve().parents[2] / "fixtures" / "histories"
FILES = sorted(HISTORIES.glob("*.json"))


def load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, path.read_text())


def patch_ids(history: WorkflowHistory) -> set[str]:
    """The ``workflow.patched`` ids recorded in a history (``core_patch`` markers)."""
    ids = set()
    for ev in history.events:
        if ev.HasField("marker_recorded_event_attributes"):
            m = ev.marker_recorded_event_attributes
            if m.marker_name == "core_patch":
                ids |= {json.loads(p.data).get("id", "") for p in m.details["patch-data"].payloads}
    return ids


def test_the_recorded_histories_are_there() -> None:
    names = {p.stem for p in FILES}
    # one parent per scenario, children for the rolling ones; a missing directory must not pass silently
    assert {"narwhal-restart-rolling", "narwhal-restart-wave", "engine-restart-readmit-retry-e0"} <= names
    types = {load(p).events[0].workflow_execution_started_event_attributes.workflow_type.name for p in FILES}
    assert types == {"EngineRestart", "RollingRestart", "WaveRestart", "FleetLock"}
    # histories from before and after the exactly-once launch patch: both paths must replay
    assert {
        "narwhal-restart-exactly-once",
        "narwhal-restart-wave-exactly-once",
        "narwhal-restart-canary",
    } <= names
    patched = {p.stem for p in FILES if PATCH_EXACTLY_ONCE_LAUNCH in patch_ids(load(p))}
    assert {"engine-restart-exactly-once-e0", "narwhal-restart-wave-exactly-once"} <= patched
    assert "engine-restart-rolling-e0" not in patched and "narwhal-restart-wave" not in patched
    assert "launch_started" in (HISTORIES / "engine-restart-exactly-once-e1.json").read_text()
    # the fleet-owner path (preflight, fleet lock, status = outcome) and the runs from before it
    owner = {p.stem for p in FILES if PATCH_FLEET_OWNER in patch_ids(load(p))}
    assert {
        "narwhal-restart-owner-canary",
        "narwhal-restart-owner-refused",
        "narwhal-restart-owner-abort",
        "narwhal-restart-owner-wave",
    } <= owner
    assert "narwhal-restart-canary" not in owner and "narwhal-restart-wave" not in owner
    failed = (HISTORIES / "narwhal-restart-owner-abort.json").read_text()
    assert "workflowExecutionFailedEventAttributes" in failed and "RestartAborted" in failed
    # the canary analysis steps (--analysis): bake, sample activities, verdicts' timers
    assert (HISTORIES / "narwhal-restart-analysis.json").read_text().count(
        '"activityType":{"name":"sample_evidence"}'
    ) == 6


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
async def test_history_replays_deterministically(path: Path) -> None:
    replayer = Replayer(
        workflows=[EngineRestart, RollingRestart, WaveRestart, FleetLock],
        data_converter=pydantic_data_converter,
    )
    result = await replayer.replay_workflow(load(path), raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.name}: {result.replay_failure!r}"


# -- the replay test can fail -----------------------------------------------------------------------


@workflow.defn(name="RollingRestart", sandboxed=False)
class ReorderedRollingRestart:
    """A "changed" RollingRestart: same start, but confirms the fleet before reading it (a different
    first activity) — the kind of edit a refactor makes without noticing."""

    @workflow.run
    async def run(self, plan: RestartPlan) -> RestartResult:
        workflow.upsert_search_attributes([FLEET_KEY.value_set(plan.fleet)])
        await workflow.execute_activity(
            "confirm_active", plan.router, start_to_close_timeout=timedelta(seconds=10)
        )
        await workflow.execute_activity(
            "read_fleet", plan.router, start_to_close_timeout=timedelta(seconds=10)
        )
        return RestartResult(fleet=plan.fleet, mode="rolling", ok=True, state="done")


async def test_a_changed_workflow_fails_replay_with_a_nondeterminism_error() -> None:
    replayer = Replayer(
        workflows=[EngineRestart, ReorderedRollingRestart, WaveRestart],
        data_converter=pydantic_data_converter,
    )
    result = await replayer.replay_workflow(
        load(HISTORIES / "narwhal-restart-rolling.json"), raise_on_replay_failure=False
    )
    assert isinstance(result.replay_failure, workflow.NondeterminismError), repr(result.replay_failure)
    assert "TMPRL1100" in str(result.replay_failure)
    assert "read_fleet" in str(result.replay_failure) and "confirm_active" in str(result.replay_failure)
