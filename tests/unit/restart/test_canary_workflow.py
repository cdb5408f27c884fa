"""The canary analysis steps of RollingRestart on the time-skipping server with fake activities:
what the verdicts do to the rollout (the live-traffic version: tests/integration/test_restart_canary.py)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from narwhal_models.evidence import AnalysisPolicy
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
from workflows.outcome import final_result
from workflows.restart import EngineRestart, FleetLock, RollingRestart, WaveRestart

POLICY = AnalysisPolicy(
    bake_s=5, interval_s=10, samples=2, min_requests=10, failure_limit=1, inconclusive_limit=1
)


def plan(**kw: Any) -> RestartPlan:
    return RestartPlan(
        fleet=f"f{uuid.uuid4().hex[:8]}",
        router=RouterRef(routers=["http://fake"]),
        supervisor=SupervisorRef(backend="local", url="http://sup"),
        timing=Timing(poll_interval_s=0.1, heartbeat_timeout_s=1.0),
        analysis=POLICY,
        **kw,
    )


async def run(
    env: WorkflowEnvironment, fleet: FakeFleet, p: RestartPlan, during: Any = None
) -> RestartResult:
    tq = f"tq-{uuid.uuid4()}"
    async with Worker(
        env.client,
        task_queue=tq,
        workflows=[EngineRestart, RollingRestart, WaveRestart, FleetLock],
        activities=fleet.activities(),
    ):
        h = await env.client.start_workflow(
            RollingRestart.run, p, id=f"narwhal-restart-{p.fleet}", task_queue=tq
        )
        if during is not None:  # (the run waits for the operator: no time skipping meanwhile)
            await during(h)
        return await asyncio.wait_for(final_result(h), 60)  # a failed run carries its result


async def test_a_failing_engine_in_a_batch_is_held_and_the_rest_is_not_restarted(
    ts_env: WorkflowEnvironment,
) -> None:
    fleet = FakeFleet.of(["prefill", "prefill", "decode", "decode", "decode"])
    fleet.failing.add("e2")
    res = await run(ts_env, fleet, plan(engines=["e0", "e2", "e1", "e3"], max_unavailable=2))
    assert (res.ok, res.state) == (False, "analysis_failed")
    assert res.engines["e2"].outcome == "failed" and "failure rate" in res.engines["e2"].error
    assert res.engines["e0"].outcome == "restarted"  # judged with e2 in the same windows: passed
    assert {res.engines[i].step for i in ("e1", "e3")} == {"pending"}
    assert "drain e2" in fleet.calls and fleet.engines["e2"].state != "active"  # held out of placement
    assert fleet.engines["e1"].restarts == 0 and fleet.engines["e3"].restarts == 0
    fail = [s for s in res.analysis if s.verdict == "fail"]
    assert [s.engines for s in fail] == [["e2"]] and fail[0].baseline.engines == ["e1", "e3", "e4"]
    assert "sample 1 e2: fail" in res.message


async def test_inconclusive_waits_for_the_operator_and_abort_stops_the_rollout(
    ts_env: WorkflowEnvironment,
) -> None:
    fleet = FakeFleet.of(["prefill", "prefill", "prefill"])
    fleet.quiet.add("e0")

    async def abort_when_asked(h: Any) -> None:
        for _ in range(60):  # the run's timers fire as the test server's clock is moved on
            p = await h.query("progress", result_type=RestartProgress)
            if p.state == "waiting_operator":
                break
            await ts_env.sleep(1)
        assert [s.verdict for s in p.analysis] == ["inconclusive", "inconclusive"]
        await h.execute_update("abort", OperatorRequest(by="bob"), result_type=OperatorAnswer)

    res = await run(ts_env, fleet, plan(engines=["e0", "e1"]), abort_when_asked)
    assert res.state == "aborted" and res.engines["e1"].step == "pending"
    assert fleet.engines["e1"].restarts == 0


async def test_with_no_engine_left_unrestarted_the_baseline_is_those_that_passed(
    ts_env: WorkflowEnvironment,
) -> None:
    fleet = FakeFleet.of(["prefill", "prefill"])
    res = await run(ts_env, fleet, plan())
    assert res.ok and res.state == "done"
    assert [s.baseline.engines for s in res.analysis if s.engines == ["e1"]] == [["e0"], ["e0"]]


async def test_a_rollback_template_puts_the_failed_engine_back_or_says_it_stays_held(
    ts_env: WorkflowEnvironment,
) -> None:
    fleet = FakeFleet.of(["prefill", "prefill", "decode"])
    fleet.failing.add("e0")
    res = await run(ts_env, fleet, plan(engines=["e0", "e1"], rollback_template="rollback"))
    assert (res.ok, res.state) == (False, "analysis_failed")  # still failed, with the evidence
    assert (
        "e0 rolled back (template rollback) and readmitted" in res.message and "failure rate" in res.message
    )
    i = fleet.calls.index("rollback e0 rollback")
    assert fleet.calls[i - 1] == "drain e0" and fleet.calls[i + 1 :] == [
        "readmit e0",
        "confirm e0 ready=False",
    ]
    assert fleet.engines["e0"].state == "active" and fleet.engines["e1"].restarts == 0
    assert res.engines["e0"].outcome == "failed" and "rolled back" in res.engines["e0"].note

    fleet = FakeFleet.of(["prefill", "prefill", "decode"])
    fleet.failing.add("e0")
    fleet.rollback_fails.add("e0")
    res = await run(ts_env, fleet, plan(engines=["e0", "e1"], rollback_template="rollback"))
    assert res.state == "analysis_failed"
    assert "e0 rollback (template rollback) failed: " in res.message and "stays held" in res.message
    assert fleet.calls.count("readmit e0") == 1  # its first readmission only: held, not readmitted
    assert fleet.engines["e0"].state != "active" and "stays held" in res.engines["e0"].note


async def test_without_a_rollback_template_no_rollback_is_run(ts_env: WorkflowEnvironment) -> None:
    fleet = FakeFleet.of(["prefill", "prefill"])
    fleet.failing.add("e0")
    res = await run(ts_env, fleet, plan(engines=["e0"]))
    assert res.state == "analysis_failed" and "rolled back" not in res.message
    assert not any(c.startswith("rollback") for c in fleet.calls) and fleet.engines["e0"].state != "active"
