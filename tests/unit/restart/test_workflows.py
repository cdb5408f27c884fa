"""Workflow logic on the time-skipping server with fake activities (no router, no engines)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from narwhal_models.restart import (
    OperatorAnswer,
    OperatorRequest,
    RestartPlan,
    RestartProgress,
    RestartResult,
    RouterRef,
    SupervisorRef,
    Timing,
)
from tests.support.restart_fakes import FakeFleet
from tests.support.temporal import until_progress
from workflows.details import engine_line
from workflows.outcome import failure_line, final_result
from workflows.restart import EngineRestart, FleetLock, RollingRestart, WaveRestart


@asynccontextmanager
async def running(env: WorkflowEnvironment, fleet: FakeFleet) -> AsyncIterator[str]:
    tq = f"tq-{uuid.uuid4()}"
    async with Worker(
        env.client,
        task_queue=tq,
        workflows=[EngineRestart, RollingRestart, WaveRestart, FleetLock],
        activities=fleet.activities(),
    ):
        yield tq


def plan(fleet_name: str = "", **kw: Any) -> RestartPlan:
    return RestartPlan(
        fleet=fleet_name or f"f{uuid.uuid4().hex[:8]}",
        router=RouterRef(routers=["http://fake"]),
        supervisor=SupervisorRef(backend="local", url="http://sup"),
        timing=Timing(poll_interval_s=0.1, heartbeat_timeout_s=1.0),
        **kw,
    )


async def start(env: WorkflowEnvironment, tq: str, p: RestartPlan) -> WorkflowHandle[Any, RestartResult]:
    wf = WaveRestart.run if p.mode == "wave" else RollingRestart.run
    return await env.client.start_workflow(wf, p, id=f"narwhal-restart-{p.fleet}", task_queue=tq)


async def done(handle: WorkflowHandle[Any, RestartResult]) -> RestartResult:
    return await asyncio.wait_for(final_result(handle), 30)


async def progress_of(handle: WorkflowHandle[Any, Any]) -> RestartProgress:
    return await handle.query("progress", result_type=RestartProgress)


def order(fleet: FakeFleet, verb: str) -> list[str]:
    return [c.split()[1] for c in fleet.calls if c.startswith(verb + " ")]


async def test_rolling_restarts_one_at_a_time_in_order(ts_env: WorkflowEnvironment) -> None:
    fleet = FakeFleet.of(["prefill", "prefill", "decode", "decode"])
    async with running(ts_env, fleet) as tq:
        res = await done(await start(ts_env, tq, plan()))
    assert res.ok and res.state == "done"
    assert order(fleet, "drain") == ["e0", "e1", "e2", "e3"]
    # strictly sequential: each engine is readmitted before the next drain
    seq = [c.split()[0] + " " + c.split()[1] for c in fleet.calls if c.split()[0] in ("drain", "readmit")]
    assert seq == [f"{v} e{i}" for i in range(4) for v in ("drain", "readmit")]
    for iid, e in res.engines.items():
        assert e.outcome == "restarted" and e.old_process_start is not None
        assert e.new_process_start is not None and e.new_process_start > e.old_process_start
        assert fleet.engines[iid].restarts == 1
        assert "draining" in e.timings and "readmitting" in e.timings


async def test_last_eligible_engine_of_a_role_is_never_drained(ts_env: WorkflowEnvironment) -> None:
    fleet = FakeFleet.of(["decode", "prefill", "decode"])  # e1 is the only prefill engine
    async with running(ts_env, fleet) as tq:
        res = await done(await start(ts_env, tq, plan()))
    assert not res.ok and res.state == "failed"
    assert order(fleet, "drain") == ["e0"]
    assert res.engines["e1"].outcome == "refused"
    assert "last eligible prefill" in res.engines["e1"].error
    assert res.engines["e2"].outcome == "pending"
    assert fleet.engines["e1"].state == "active"


async def test_max_unavailable_batches_keep_a_role_available(ts_env: WorkflowEnvironment) -> None:
    fleet = FakeFleet.of(["prefill", "prefill", "decode", "decode"])
    async with running(ts_env, fleet) as tq:
        res = await done(await start(ts_env, tq, plan(max_unavailable=2)))
    assert res.ok
    drains = order(fleet, "drain")
    # e0+e1 would remove every prefill engine: batches are [e0], [e1, e2], [e3]
    assert drains[0] == "e0" and set(drains[1:3]) == {"e1", "e2"} and drains[3] == "e3"


async def test_deadline_policy_fail_stops_without_restarting(ts_env: WorkflowEnvironment) -> None:
    fleet = FakeFleet.of(["prefill", "prefill", "decode"])
    fleet.deadline_exceeded.add("e0")
    async with running(ts_env, fleet) as tq:
        res = await done(await start(ts_env, tq, plan(deadline_policy="fail")))
    assert not res.ok and res.engines["e0"].outcome == "failed"
    assert "deadline exceeded" in res.engines["e0"].error
    assert fleet.engines["e0"].restarts == 0 and order(fleet, "drain") == ["e0"]


async def test_deadline_policy_wait_keeps_waiting(ts_env: WorkflowEnvironment) -> None:
    fleet = FakeFleet.of(["prefill", "prefill"])
    fleet.deadline_exceeded.add("e0")
    async with running(ts_env, fleet) as tq:
        res = await done(await start(ts_env, tq, plan(deadline_policy="wait", engines=["e0"])))
    assert res.ok
    assert "wait_stop e0 stop_on_deadline=False" in fleet.calls


async def test_deadline_policy_approve_waits_for_the_operator(ts_env: WorkflowEnvironment) -> None:
    fleet = FakeFleet.of(["prefill", "prefill"])
    fleet.deadline_exceeded.add("e0")
    fleet.stuck.add("e0")
    async with running(ts_env, fleet) as tq:
        h = await start(ts_env, tq, plan(deadline_policy="approve", engines=["e0"]))
        p = await until_progress(
            h, lambda p: p.engines["e0"].step == "awaiting_approval" and p.engines["e0"].waiting_for != ""
        )
        assert p.state == "waiting_operator" and fleet.engines["e0"].restarts == 0
        with pytest.raises(WorkflowUpdateFailedError):  # nothing to retry
            await h.execute_update("retry", OperatorRequest(iid="e0"), result_type=OperatorAnswer)
        ans = await h.execute_update(
            "approve", OperatorRequest(iid="e0", by="alice"), result_type=OperatorAnswer
        )
        assert ans.accepted
        res = await done(h)
    assert res.ok and fleet.engines["e0"].restarts == 1


async def test_readmit_refusal_waits_then_retry_completes(ts_env: WorkflowEnvironment) -> None:
    fleet = FakeFleet.of(["prefill", "prefill", "decode", "decode"])
    fleet.fail_readmit.add("e0")
    async with running(ts_env, fleet) as tq:
        h = await start(ts_env, tq, plan())
        p = await until_progress(h, lambda p: p.engines["e0"].step == "blocked")
        assert p.state == "waiting_operator" and "wrong" in p.engines["e0"].error
        assert fleet.engines["e0"].state == "blocked" and order(fleet, "drain") == ["e0"]
        fleet.fail_readmit.clear()  # the operator repaired the engine
        ans = await h.execute_update("retry", OperatorRequest(by="bob"), result_type=OperatorAnswer)
        assert "retry applied to e0" in ans.message
        res = await done(h)
    assert res.ok, (res.message, fleet.calls)
    assert order(fleet, "readmit").count("e0") == 2
    assert all(e.restarts == 1 for e in fleet.engines.values())


async def test_readmit_refusal_then_abort_leaves_engine_held(ts_env: WorkflowEnvironment) -> None:
    fleet = FakeFleet.of(["prefill", "prefill", "decode"])
    fleet.fail_readmit.add("e0")
    async with running(ts_env, fleet) as tq:
        h = await start(ts_env, tq, plan())
        await until_progress(h, lambda p: p.engines["e0"].step == "blocked")
        await h.execute_update("abort", OperatorRequest(reason="give up"), result_type=OperatorAnswer)
        res = await done(h)
    assert not res.ok and res.state == "aborted"
    assert res.engines["e0"].outcome == "aborted" and res.engines["e1"].outcome == "pending"
    assert fleet.engines["e0"].state == "blocked"  # never forced back
    assert order(fleet, "drain") == ["e0"]


async def test_pause_takes_effect_between_engines(ts_env: WorkflowEnvironment) -> None:
    fleet = FakeFleet.of(["prefill", "prefill", "decode", "decode"])
    fleet.readmit_gate = asyncio.Event()
    async with running(ts_env, fleet) as tq:
        h = await start(ts_env, tq, plan())
        await asyncio.wait_for(fleet.readmit_entered.wait(), 10)
        await h.signal("pause")
        await h.signal("pause")  # a second pause changes nothing and is not recorded again
        fleet.readmit_gate.set()
        await until_progress(h, lambda p: p.engines["e0"].outcome == "restarted" and p.state == "paused")
        await asyncio.sleep(0.3)  # a window in which a pause that did not hold would drain e1
        p = await h.query("progress", result_type=RestartProgress)  # read after the window
        assert p.state == "paused" and [ev.kind for ev in p.events] == ["paused"]
        assert order(fleet, "drain") == ["e0"] and p.engines["e1"].step == "pending"
        await h.signal("resume")
        res = await done(h)
    assert res.ok and order(fleet, "drain") == ["e0", "e1", "e2", "e3"]


async def test_pause_while_the_fleet_is_read_before_the_next_engine_holds_that_engine(
    ts_env: WorkflowEnvironment,
) -> None:
    """The pause arrives while the workflow reads the fleet to pick its next batch: that batch must
    not start (it did: e1 was drained after the operator saw "paused between engines")."""
    fleet = FakeFleet.of(["prefill", "prefill", "decode", "decode"])
    fleet.read_gate, fleet.read_gate_after = asyncio.Event(), "readmit e0"
    async with running(ts_env, fleet) as tq:
        h = await start(ts_env, tq, plan())
        await asyncio.wait_for(fleet.read_entered.wait(), 10)  # e0 is back; the read for e1 is held
        await h.signal("pause")
        await until_progress(h, lambda p: p.state == "paused")
        fleet.read_gate.set()  # the read returns after the pause
        await until_progress(h, lambda p: p.message == "paused between engines")
        p = await h.query("progress", result_type=RestartProgress)
        assert p.state == "paused" and p.engines["e1"].step == "pending"
        assert order(fleet, "drain") == ["e0"]
        await h.signal("resume")
        res = await done(h)
    assert res.ok and order(fleet, "drain") == ["e0", "e1", "e2", "e3"]


async def test_wave_restart_repeats_drain_after_capture_failure(ts_env: WorkflowEnvironment) -> None:
    fleet = FakeFleet.of(["prefill", "decode", "decode"])
    fleet.capture_fail_once.add("e2")
    async with running(ts_env, fleet) as tq:
        res = await done(await start(ts_env, tq, plan(mode="wave")))
    assert res.ok and res.mode == "wave"
    assert fleet.calls[:4] == ["preflight", "drain e0,e1,e2 wave", "start e2", "drain e0,e1,e2 wave"]
    assert sorted(order(fleet, "restart")) == ["e0", "e1", "e2"]
    assert "readmit e0,e1,e2" in fleet.calls and "confirm e0,e1,e2 ready=True" in fleet.calls
    assert all(e.restarts == 1 for e in fleet.engines.values())


async def test_wave_readmit_refusal_then_abort(ts_env: WorkflowEnvironment) -> None:
    fleet = FakeFleet.of(["prefill", "decode"])
    fleet.fail_readmit.add("e1")
    async with running(ts_env, fleet) as tq:
        h = await start(ts_env, tq, plan(mode="wave"))
        p = await until_progress(h, lambda p: p.state == "waiting_operator")
        assert {e.step for e in p.engines.values()} == {"blocked"}
        await h.execute_update("abort", OperatorRequest(), result_type=OperatorAnswer)
        res = await done(h)
    assert res.state == "aborted" and not res.ok
    assert {e.state for e in fleet.engines.values()} == {"blocked"}


def short_restart_timeout(**kw: Any) -> RestartPlan:
    p = plan(**kw)
    return p.model_copy(update={"timing": p.timing.model_copy(update={"new_process_timeout_s": 2.0})})


async def test_restart_timeout_blocks_engine_then_retry_completes(ts_env: WorkflowEnvironment) -> None:
    fleet = FakeFleet.of(["prefill", "prefill", "decode", "decode"])
    fleet.never_back.add("e0")
    async with running(ts_env, fleet) as tq:
        h = await start(ts_env, tq, short_restart_timeout())
        p = await until_progress(h, lambda p: p.engines["e0"].step == "blocked")
        e0 = p.engines["e0"]
        assert p.state == "waiting_operator", p.message
        assert "no newer process within the restart timeout (2s)" in e0.error, e0.error
        assert "retry" in e0.waiting_for and e0.outcome == "running"
        assert order(fleet, "readmit") == [] and order(fleet, "drain") == ["e0"]
        fleet.never_back.clear()  # the operator freed the port
        await h.execute_update("retry", OperatorRequest(by="bob"), result_type=OperatorAnswer)
        res = await done(h)
    assert res.ok, (res.message, fleet.calls)
    assert order(fleet, "restart").count("e0") == 2  # restarted again (guarded), then a newer process
    assert res.engines["e0"].outcome == "restarted" and fleet.engines["e0"].restarts == 1


async def test_wave_restart_timeout_then_abort_leaves_engines_held(ts_env: WorkflowEnvironment) -> None:
    fleet = FakeFleet.of(["prefill", "decode", "decode"])
    fleet.never_back.add("e1")
    async with running(ts_env, fleet) as tq:
        h = await start(ts_env, tq, short_restart_timeout(mode="wave"))
        p = await until_progress(h, lambda p: p.state == "waiting_operator")
        assert p.engines["e1"].step == "blocked" and "restart timeout" in p.engines["e1"].error
        assert p.engines["e0"].step == "waiting_for_new_process" and p.engines["e0"].error == ""
        await h.execute_update("abort", OperatorRequest(reason="port taken"), result_type=OperatorAnswer)
        res = await done(h)
    assert res.state == "aborted" and not res.ok
    assert res.engines["e1"].outcome == "aborted"
    assert not any(c.startswith("readmit") for c in fleet.calls)  # nobody is readmitted: engines stay held


# -- exactly-once launches ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["rolling", "wave"])
async def test_a_lost_attempt_that_never_launched_is_launched_again(
    ts_env: WorkflowEnvironment, mode: str
) -> None:
    fleet = FakeFleet.of(["prefill", "prefill", "decode", "decode"])
    fleet.lose_launch["e1"] = "before"
    async with running(ts_env, fleet) as tq:
        res = await done(await start(ts_env, tq, plan(mode=mode)))
    assert res.ok, res.message
    assert order(fleet, "restart").count("e1") == 2  # the lost attempt reported nothing: launch again
    assert fleet.launched_commands.count("e1") == 1 and fleet.engines["e1"].restarts == 1


@pytest.mark.parametrize("mode", ["rolling", "wave"])
async def test_a_recorded_launch_is_never_repeated(ts_env: WorkflowEnvironment, mode: str) -> None:
    fleet = FakeFleet.of(["prefill", "prefill", "decode", "decode"])
    fleet.lose_launch["e1"] = "after"
    async with running(ts_env, fleet) as tq:
        res = await done(await start(ts_env, tq, plan(mode=mode)))
    assert res.ok, res.message
    assert order(fleet, "restart").count("e1") == 1 and fleet.launched_commands.count("e1") == 1
    assert res.engines["e1"].new_process_start == 1101.0


async def test_an_engine_already_running_a_newer_process_is_not_launched(ts_env: WorkflowEnvironment) -> None:
    fleet = FakeFleet.of(["prefill", "prefill"])
    fleet.lose_launch["e0"] = "external"
    async with running(ts_env, fleet) as tq:
        res = await done(await start(ts_env, tq, plan()))
    assert res.ok, res.message
    assert order(fleet, "restart") == ["e1"] and order(fleet, "probe") == ["e0", "e1"]
    assert res.engines["e0"].outcome == "restarted" and not res.engines["e0"].restarted_by_us


# -- canary gate --------------------------------------------------------------------------------------


@pytest.mark.parametrize("release", ["approve", "resume"])
async def test_canary_gate_waits_for_the_operator_after_n_engines(
    ts_env: WorkflowEnvironment, release: str
) -> None:
    fleet = FakeFleet.of(["prefill", "prefill", "decode", "decode"])
    async with running(ts_env, fleet) as tq:
        h = await start(ts_env, tq, plan(pause_after=2))
        p = await until_progress(h, lambda p: p.state == "waiting_operator")
        assert [e.outcome for e in p.engines.values()] == ["restarted", "restarted", "pending", "pending"]
        assert "canary gate" in p.message and p.events[-1].kind == "waiting_for_operator"
        assert order(fleet, "drain") == ["e0", "e1"]  # nothing after the gate
        with pytest.raises(WorkflowUpdateFailedError):  # naming an engine is not the gate
            await h.execute_update("approve", OperatorRequest(iid="e2"), result_type=OperatorAnswer)
        if release == "approve":
            ans = await h.execute_update("approve", OperatorRequest(by="ann"), result_type=OperatorAnswer)
            assert "canary gate approved" in ans.message
        else:
            await h.signal("resume")
        res = await done(h)
    assert res.ok and order(fleet, "drain") == ["e0", "e1", "e2", "e3"]
    kinds = [ev.kind for ev in res.events]
    assert kinds == ["waiting_for_operator", "approved" if release == "approve" else "resumed"]
    assert (res.events[-1].by == "ann") is (release == "approve")


# -- one owner per fleet, run status = outcome, abort, role floors ---------------------------------


async def status_of(env: WorkflowEnvironment, wid: str) -> WorkflowExecutionStatus | None:
    return (await env.client.get_workflow_handle(wid).describe()).status


async def test_a_second_run_on_a_held_fleet_is_refused_before_it_touches_anything(
    ts_env: WorkflowEnvironment,
) -> None:
    fleet = FakeFleet.of(["prefill", "prefill", "decode", "decode"])
    async with running(ts_env, fleet) as tq:
        first = await start(ts_env, tq, plan(pause_after=1))
        await until_progress(first, lambda p: p.state == "waiting_operator")
        assert (await progress_of(first)).fleet_lock.startswith("narwhal-fleet-lock-")
        # another fleet name, another workflow id: the same engines, so the same lock
        second = await start(ts_env, tq, plan())
        with pytest.raises(WorkflowFailureError) as caught:
            await asyncio.wait_for(second.result(), 30)
        cause = caught.value.cause
        assert isinstance(cause, ApplicationError) and cause.type == "FleetBusy"
        assert f"already being restarted by {first.id}" in cause.message
        assert await status_of(ts_env, second.id) == WorkflowExecutionStatus.FAILED
        assert order(fleet, "drain") == ["e0"]  # the refused run drained nothing
        await first.execute_update("approve", OperatorRequest(by="alice"), result_type=OperatorAnswer)
        res = await done(first)
        assert res.ok and all(e.restarts == 1 for e in fleet.engines.values()), (res.message, fleet.calls)
        # the lock went with its owner: the next run takes the fleet
        third = await start(ts_env, tq, plan(engines=["e0"]))
        assert (await done(third)).ok and fleet.engines["e0"].restarts == 2


async def test_a_failed_run_fails_with_its_reason(ts_env: WorkflowEnvironment) -> None:
    fleet = FakeFleet.of(["decode", "prefill", "decode"])  # e1: the only prefill engine (pinned)
    async with running(ts_env, fleet) as tq:
        h = await start(ts_env, tq, plan())
        with pytest.raises(WorkflowFailureError) as caught:
            await asyncio.wait_for(h.result(), 30)
        assert await status_of(ts_env, h.id) == WorkflowExecutionStatus.FAILED
        p = await progress_of(h)
    assert isinstance(caught.value.cause, ApplicationError)
    assert (
        caught.value.cause.type == "RestartFailed" and "last eligible prefill" in caught.value.cause.message
    )
    assert p.state == "failed" and p.fleet_lock == ""  # released


async def test_a_preflight_failure_ends_the_run_in_its_first_activity(ts_env: WorkflowEnvironment) -> None:
    fleet = FakeFleet.of(["prefill", "decode"])
    fleet.preflight_error = "preflight: control token variable T is not set on the worker"
    async with running(ts_env, fleet) as tq:
        h = await start(ts_env, tq, plan())
        with pytest.raises(WorkflowFailureError) as caught:
            await asyncio.wait_for(h.result(), 30)
        p = await progress_of(h)
    assert failure_line(caught.value) == fleet.preflight_error
    assert p.state == "failed" and p.message == fleet.preflight_error and fleet.calls == ["preflight"]


async def test_abort_while_restarting_stops_there_and_says_so(ts_env: WorkflowEnvironment) -> None:
    fleet = FakeFleet.of(["prefill", "prefill", "decode"])
    fleet.never_back.add("e0")  # the restart command returned; no newer process serves yet
    async with running(ts_env, fleet) as tq:
        h = await start(ts_env, tq, plan())
        await until_progress(h, lambda p: p.engines["e0"].step == "waiting_for_new_process")
        try:
            ans = await h.execute_update(
                "abort", OperatorRequest(by="alice", reason="bad build"), result_type=OperatorAnswer
            )
            assert "e0 stop at the next safe point" in ans.message
        except RPCError as exc:  # the Java test server can lose an update's outcome once the run closed
            assert "not found" in exc.message  # the answer is asserted on the dev server (integration)
        with pytest.raises(WorkflowFailureError) as caught:
            await asyncio.wait_for(h.result(), 30)
        res = await done(h)
    assert failure_line(caught.value).startswith("aborted by alice: bad build")
    e0 = res.engines["e0"]
    assert res.state == "aborted" and e0.outcome == "aborted" and e0.new_process_start is None
    assert "restart aborted while waiting for its newer process" in e0.note
    line = engine_line(e0, res.finished_at)
    assert "aborted: restart aborted" in line and "restarted in" not in line
    assert "not restarted" in engine_line(res.engines["e1"]) or res.engines["e1"].outcome == "pending"
    assert fleet.engines["e0"].state != "active" and order(fleet, "readmit") == []
    assert order(fleet, "drain") == ["e0"]


async def test_unpinned_two_engine_fleet_rolls_under_the_routers_floor_rule(
    ts_env: WorkflowEnvironment,
) -> None:
    """docs/vllm.md: one prefill + one decode engine, both unpinned — each can serve either leg."""
    fleet = FakeFleet.of(["prefill", "decode"])
    fleet.pins, fleet.floors = {"e0": False, "e1": False}, {"prefill": 1, "decode": 1}
    async with running(ts_env, fleet) as tq:
        res = await done(await start(ts_env, tq, plan()))
    assert res.ok and order(fleet, "drain") == ["e0", "e1"]
    pinned = FakeFleet.of(["prefill", "decode"])
    pinned.pins, pinned.floors = {"e0": True, "e1": True}, {"prefill": 1, "decode": 1}
    async with running(ts_env, pinned) as tq:
        res = await done(await start(ts_env, tq, plan()))
    assert not res.ok and "would leave 0 engine(s) able to serve prefill" in res.engines["e0"].error
    assert order(pinned, "drain") == []
