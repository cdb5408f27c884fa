"""``WaveRestart`` — spec §13.2: the whole fleet as one engine set.

wave drain (``/ready`` withdrawn; a 503 identity-capture failure → start that engine under the
hold and repeat the drain) → wait ``wave.ready_to_stop`` → restart every engine in parallel →
wait for every newer process → wave readmit (409 → the wave stays blocked, wait for
``retry``/``abort``) → every engine ``active`` + ``accepts_new`` and ``/ready`` 200 again.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.router import LifecycleActivities
    from narwhal_models.restart import (
        EngineProgress,
        LaunchReport,
        OperatorAnswer,
        OperatorRequest,
        RestartPlan,
        RestartProgress,
        RestartResult,
        RunState,
    )
    from workflows.details import render
    from workflows.owner import FleetOwner, run_outcome
    from workflows.steps import FLEET_KEY, RunbookSteps


@workflow.defn(name="WaveRestart")
class WaveRestart(RunbookSteps):
    @workflow.init
    def __init__(self, plan: RestartPlan) -> None:
        self._setup(
            fleet=plan.fleet, router=plan.router, supervisor=plan.supervisor, timing=plan.timing,
            deadline_s=plan.deadline_s, deadline_policy=plan.deadline_policy, engine_urls=plan.engine_urls,
        )  # fmt: skip
        self.plan = plan
        self.paused = False
        self.run_state: RunState = "starting"
        self.started_at: float | None = None
        self.owner = FleetOwner()
        self.end_message = ""

    def state_keyword(self) -> str:
        return self.run_state if self.run_state != "running" else self._running_state()

    def _running_state(self) -> str:
        if self.any_waiting():
            return "waiting_operator"
        return "paused" if self.paused else "running"

    def header(self) -> str:
        return f"{self.fleet}: whole-wave restart {self.wave_id}".rstrip()

    def details(self) -> str:
        return render(
            self.header(), self.state_keyword(), self.engines.values(), self.started_at, self.now(),
            self._message(), self.events,
        )  # fmt: skip

    def _message(self) -> str:
        if self.end_message:
            return self.end_message
        if self.run_state == "starting" and self.owner.enabled():
            return "preflight from the worker, then the fleet lock"
        if self.run_state == "done":
            return "every engine restarted and readmitted; /ready restored"
        if self.run_state in ("failed", "aborted"):
            return self._failure()
        if self.paused:
            return "paused: the wave drain waits for resume"
        return ""

    @workflow.run
    async def run(self, plan: RestartPlan) -> RestartResult:
        self.started_at = self.now()
        workflow.upsert_search_attributes([FLEET_KEY.value_set(plan.fleet)])
        if self.owner.decide():
            await self.publish()
            held = await self.owner.take(plan)
            if held is None:
                self.run_state = "failed"
                return await self._end(False, self.owner.refusal)
            view = held
        else:
            view = await workflow.execute_activity_method(
                LifecycleActivities.read_fleet,
                plan.router,
                start_to_close_timeout=timedelta(seconds=plan.router.request_timeout_s * 3 + 5),
                schedule_to_close_timeout=timedelta(seconds=plan.timing.router_call_timeout_s),
                summary="read the fleet's lifecycle",
            )
        iids = sorted(view.engines)
        for iid in iids:
            self.engines[iid] = EngineProgress(iid=iid, router_state=view.engines[iid].state)
        self.run_state = "running"
        await self.publish()
        ok = False
        if self.paused:
            await workflow.wait_condition(
                lambda: not self.paused or (self.decision is not None and self.decision.kind == "abort")
            )
        if self.decision is not None and self.decision.kind == "abort":
            await self.take_decision(iids, {"abort"})
            await self.step(iids, "aborted", note="aborted before the wave drain")
        elif await self.drain(iids, wave=True) and await self.wait_to_stop(iids, wave=True):
            ok = await self.restart(iids) and await self.readmit(iids, wave=True)
        aborted = any(e.outcome == "aborted" for e in self.engines.values())
        self.run_state = "done" if ok else ("aborted" if aborted else "failed")
        message = "every engine restarted and readmitted; /ready restored" if ok else self._failure()
        if aborted and self.owner.enabled() and self.abort_taken is not None:
            d = self.abort_taken
            self.owner.abort_by, self.owner.abort_reason = d.by or "operator", d.reason
            message = self.owner.aborted_message(message, self.engines.values())
        return await self._end(ok, message)

    async def _end(self, ok: bool, message: str) -> RestartResult:
        self.finished = True
        if self.owner.enabled():
            self.end_message = message
        await self.publish()
        await workflow.wait_condition(workflow.all_handlers_finished)
        await self.owner.release()
        result = RestartResult(
            fleet=self.plan.fleet, mode="wave", ok=ok, state=self.run_state, message=message,
            started_at=self.started_at, finished_at=self.now(), engines=self.engines, events=self.events,
        )  # fmt: skip
        if self.owner.enabled():
            await self.publish()
            run_outcome(result)
        return result

    def _failure(self) -> str:
        return "; ".join(
            f"{e.iid} {e.step}: {e.error or e.note}"
            for e in self.engines.values()
            if e.outcome != "restarted"
        )

    # -- operator controls -------------------------------------------------------------------------

    @workflow.query
    def progress(self) -> RestartProgress:
        return RestartProgress(
            fleet=self.fleet, mode="wave", workflow_id=workflow.info().workflow_id,
            state=self.state_keyword(),
            paused=self.paused, message=self._message() or self.header(), deadline_policy=self.deadline_policy,
            supervisor=self.supervisor.backend, wave_id=self.wave_id, started_at=self.started_at,
            fleet_lock=self.owner.lock_id if self.owner.held else "",
            updated_at=self.now(), engines=self.engines, events=self.events,
        )  # fmt: skip

    @workflow.signal
    def launch_started(self, r: LaunchReport) -> None:
        """From the restart activity, before it launches: the durable launch record."""
        self.record_launch(r)

    @workflow.signal
    async def pause(self) -> None:
        """Takes effect before the wave drain only: once drained, the fleet is already down."""
        if self.paused and self.owner.enabled():
            return  # a second pause changes nothing (and is not recorded twice)
        self.paused = True
        self.note_event("paused")
        await self.publish()

    @workflow.signal
    async def resume(self) -> None:
        self.paused = False
        self.note_event("resumed")
        await self.publish()

    @workflow.update
    async def approve(self, req: OperatorRequest) -> OperatorAnswer:
        return await self.apply_decision("approve", req.model_copy(update={"iid": ""}))

    @approve.validator
    def _approve_ok(self, req: OperatorRequest) -> None:
        self.validate_decision("approve", req.model_copy(update={"iid": ""}))

    @workflow.update
    async def retry(self, req: OperatorRequest) -> OperatorAnswer:
        return await self.apply_decision("retry", req.model_copy(update={"iid": ""}))

    @retry.validator
    def _retry_ok(self, req: OperatorRequest) -> None:
        self.validate_decision("retry", req.model_copy(update={"iid": ""}))

    @workflow.update
    async def abort(self, req: OperatorRequest) -> OperatorAnswer:
        return await self.apply_decision("abort", req.model_copy(update={"iid": ""}))

    @abort.validator
    def _abort_ok(self, req: OperatorRequest) -> None:
        self.validate_decision("abort", req.model_copy(update={"iid": ""}))
