"""Restart workflows — the runbooks of spec §13 as durable plans.

- ``EngineRestart``: one engine — drain, wait until ``ready_to_stop`` (deadline policy), restart
  through the supervisor backend, wait for a newer process, readmit, confirm ``active`` +
  ``accepts_new``. A refused readmission leaves the engine blocked and waits for ``retry``/``abort``.
- ``RollingRestart``: engines one (or ``max_unavailable``) at a time as child ``EngineRestart``s,
  never draining the last eligible engine of a role; stops at the first engine that fails.
- ``WaveRestart`` (workflows/wave.py): the whole fleet as one set (§13.2).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ChildWorkflowError, WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    from activities.documents import KNOWN_ROLES
    from activities.router import LifecycleActivities
    from narwhal_models.restart import (
        FINAL_STEPS,
        WAITING_FOR_OPERATOR,
        Decision,
        EngineProgress,
        EngineRestartInput,
        FleetView,
        LaunchReport,
        OperatorAnswer,
        OperatorEvent,
        OperatorRequest,
        RestartPlan,
        RestartProgress,
        RestartResult,
        RunState,
        engine_workflow_id,
        fleet_workflow_id,
    )
    from workflows.analysis import baseline_of
    from workflows.analysis_text import analysis_table
    from workflows.canary import CanaryAnalysis
    from workflows.details import render
    from workflows.fleet_lock import FleetLock
    from workflows.floors import floor_breach
    from workflows.owner import FleetOwner, run_outcome
    from workflows.steps import (
        ABORTABLE,
        FLEET_KEY,
        IN_PROGRESS,
        MAX_EVENTS,
        STATE_KEY,
        RunbookSteps,
        cause_message,
    )
    from workflows.wave import WaveRestart

__all__ = ["EngineRestart", "FleetLock", "RollingRestart", "WaveRestart", "pick_batch"]

# workflow.patched id: a pause (or abort) that arrives while the fleet is read before a batch takes
# effect before that batch (was: the batch started, so an engine restarted after the pause).
PATCH_PAUSE_DURING_FLEET_READ = "pause-during-fleet-read"


@workflow.defn(name="EngineRestart")
class EngineRestart(RunbookSteps):
    @workflow.init
    def __init__(self, inp: EngineRestartInput) -> None:
        self._setup(
            fleet=inp.fleet, router=inp.router, supervisor=inp.supervisor, timing=inp.timing,
            deadline_s=inp.deadline_s, deadline_policy=inp.deadline_policy,
            engine_urls={inp.iid: inp.engine_url} if inp.engine_url else {},
        )  # fmt: skip
        self.inp = inp
        self.engines[inp.iid] = EngineProgress(iid=inp.iid)

    def state_keyword(self) -> str:
        return self.engines[self.inp.iid].step

    def header(self) -> str:
        return f"{self.inp.iid} of {self.fleet} (drain deadline {self.deadline_s:g} s, policy {self.deadline_policy})"

    async def on_change(self) -> None:
        parent = workflow.info().parent
        if self.inp.report_to_parent and parent is not None:
            handle = workflow.get_external_workflow_handle(parent.workflow_id)
            await handle.signal("engine_progress", self.engines[self.inp.iid])

    @workflow.run
    async def run(self, inp: EngineRestartInput) -> EngineProgress:
        self.started_at = self.now()
        workflow.upsert_search_attributes([FLEET_KEY.value_set(inp.fleet)])
        iids = [inp.iid]
        if self.decision is not None and self.decision.kind == "abort":
            await self.take_decision(iids, {"abort"})
            await self.step(iids, "aborted", note="aborted before the drain")
        elif await self.drain(iids, wave=False) and await self.wait_to_stop(iids, wave=False):
            if await self.restart(iids):
                await self.readmit(iids, wave=False)
        self.finished = True
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self.engines[inp.iid]

    @workflow.query
    def progress(self) -> EngineProgress:
        return self.engines[self.inp.iid]

    @workflow.signal
    def launch_started(self, r: LaunchReport) -> None:
        """From the restart activity, before it launches: the durable launch record."""
        self.record_launch(r)

    @workflow.signal
    def decide(self, d: Decision) -> None:
        """From the parent RollingRestart (updates cannot be sent workflow-to-workflow)."""
        if self.decision_applicable(d):
            self.decision = d
        else:
            workflow.logger.warning("ignoring %s: not applicable at step %s", d.kind, self.state_keyword())

    @workflow.update
    async def approve(self, req: OperatorRequest) -> OperatorAnswer:
        return await self.apply_decision("approve", req)

    @approve.validator
    def _approve_ok(self, req: OperatorRequest) -> None:
        self.validate_decision("approve", req)

    @workflow.update
    async def retry(self, req: OperatorRequest) -> OperatorAnswer:
        return await self.apply_decision("retry", req)

    @retry.validator
    def _retry_ok(self, req: OperatorRequest) -> None:
        self.validate_decision("retry", req)

    @workflow.update
    async def abort(self, req: OperatorRequest) -> OperatorAnswer:
        return await self.apply_decision("abort", req)

    @abort.validator
    def _abort_ok(self, req: OperatorRequest) -> None:
        self.validate_decision("abort", req)


def pick_batch(queue: list[str], view: FleetView, max_unavailable: int) -> tuple[list[str], str]:
    """Next engines to restart together, in queue order, keeping one eligible engine per role.

    Returns (batch, refusal); an empty batch comes with the reason the head of the queue can
    never be drained alone.
    """
    eligible = {i for i, e in view.engines.items() if e.accepts_new}
    if view.roles_error:
        return [], f"role safety: engine roles unknown ({view.roles_error})"
    # with the router's floors: its own rule (``workflows.floors``: labelled or unpinned engines
    # count, ``controller.min_prefill`` / ``min_decode`` as ``/narwhal/state`` reports them);
    # without them (a router without /narwhal/state): one eligible engine of the same label per role
    checked = set(queue[:1]) if view.floors else eligible | set(queue[:1])
    unknown = sorted(i for i in checked if view.roles.get(i) not in KNOWN_ROLES)
    if unknown:
        shown = ", ".join(f"{i}={view.roles.get(i, '(missing)')}" for i in unknown)
        return [], f"role safety: unknown role for {shown} in /narwhal/handoff"

    def by_floor(iid: str, batch: list[str]) -> str:
        breach = floor_breach(view.roles, view.pins, eligible, view.floors, [*batch, iid])
        if breach is None:
            return ""
        return (
            f"{iid}: draining it would leave {breach.remaining} engine(s) able to serve {breach.role} "
            f"(floor {breach.floor}, controller.min_{breach.role})"
        )

    def by_label(iid: str, batch: list[str]) -> str:
        role = view.roles[iid]
        left = eligible - set(batch) - {iid}
        if left and any(view.roles.get(o) == role for o in left):
            return ""
        return f"{iid} is the last eligible {role} engine"

    refusal = by_floor if view.floors else by_label
    batch: list[str] = []
    for iid in queue:
        if len(batch) >= max_unavailable:
            break
        e = view.engines.get(iid)
        if e is None or e.state != "active" or not e.accepts_new:
            why = "unknown to the router" if e is None else f"{e.state}, accepts_new={e.accepts_new}"
            return (batch, "") if batch else ([], f"{iid} is not serving ({why})")
        why = refusal(iid, batch)
        if why:
            return (batch, "") if batch else ([], why)
        batch.append(iid)
    return batch, ""


@workflow.defn(name="RollingRestart")
class RollingRestart:
    @workflow.init
    def __init__(self, plan: RestartPlan) -> None:
        self.plan = plan
        self.paused = False
        self.abort_requested = False
        self.finished = False
        self.p = RestartProgress(
            fleet=plan.fleet, mode="rolling", workflow_id=workflow.info().workflow_id,
            deadline_policy=plan.deadline_policy, max_unavailable=plan.max_unavailable,
            supervisor=plan.supervisor.backend, pause_after=plan.pause_after,
        )  # fmt: skip
        self._sa_state = ""
        self.gate = False  # the canary gate (--pause-after) waits for resume / approve
        self._gate_passed = False
        self._waiting: set[str] = set()
        self.owner = FleetOwner()
        self._abort_sent: set[str] = set()
        self.analysis = CanaryAnalysis(self, plan.analysis) if plan.analysis is not None else None

    # -- progress --------------------------------------------------------------------------------

    def _state(self) -> RunState:
        if self.gate or any(e.step in WAITING_FOR_OPERATOR for e in self.p.engines.values()):
            return "waiting_operator"
        return "paused" if self.paused else "running"

    def _event(self, kind: str, iid: str = "", by: str = "", detail: str = "") -> None:
        self.p.events.append(
            OperatorEvent(at=workflow.now().timestamp(), kind=kind, iid=iid, by=by, detail=detail)
        )
        del self.p.events[:-MAX_EVENTS]

    def _publish(self, state: RunState | None = None, message: str | None = None) -> None:
        self.p.state = state or self._state()
        self.p.paused = self.paused
        self.p.abort_requested = self.abort_requested
        self.p.fleet_lock = self.owner.lock_id if self.owner.held else ""
        if message is not None:
            self.p.message = message
        now = workflow.now().timestamp()
        self.p.updated_at = now
        title = f"{self.p.fleet}: rolling restart, {self.plan.max_unavailable} at a time"
        workflow.set_current_details(
            render(
                title,
                self.p.state,
                self.p.engines.values(),
                self.p.started_at,
                now,
                self.p.message,
                self.p.events,
            )
            + (f"\n\n{analysis_table(self.p.analysis)}" if self.p.analysis else "")
        )
        if self.p.state != self._sa_state:
            self._sa_state = self.p.state
            workflow.upsert_search_attributes([STATE_KEY.value_set(self.p.state)])

    async def _read_fleet(self) -> FleetView:
        return await workflow.execute_activity_method(
            LifecycleActivities.read_fleet,
            self.plan.router,
            start_to_close_timeout=timedelta(seconds=self.plan.router.request_timeout_s * 3 + 5),
            schedule_to_close_timeout=timedelta(seconds=self.plan.timing.router_call_timeout_s),
            summary="read the fleet's lifecycle",
        )

    # -- the plan --------------------------------------------------------------------------------

    @workflow.run
    async def run(self, plan: RestartPlan) -> RestartResult:
        self.p.started_at = workflow.now().timestamp()
        workflow.upsert_search_attributes([FLEET_KEY.value_set(plan.fleet)])
        if self.owner.decide():
            self._publish(state="starting", message="preflight from the worker, then the fleet lock")
            held = await self.owner.take(plan)
            if held is None:
                return await self._end(False, "failed", self.owner.refusal)
            view = held
        else:
            view = await self._read_fleet()
        queue = list(plan.engines) or sorted(view.engines)
        for iid in queue:
            self.p.engines[iid] = EngineProgress(
                iid=iid, router_state=view.engines[iid].state if iid in view.engines else "",
                build=view.engines[iid].build if iid in view.engines else "",
            )  # fmt: skip
        self._publish(message=f"{len(queue)} engine(s), {plan.max_unavailable} at a time")
        failed = ""
        while queue and not failed:
            if self.paused:
                self._publish(message="paused between engines")
                await workflow.wait_condition(
                    lambda: not self.paused or self.abort_requested or self.owner.lost()
                )
            if self._canary_due(queue):
                self.gate = True
                n = self.plan.pause_after
                self._event(
                    "waiting_for_operator", detail=f"canary gate after {n} engine(s): resume or approve"
                )
                self._publish(
                    message=f"canary gate: {n} engine(s) back in service; waiting for the operator (resume or approve)"
                )
                await workflow.wait_condition(
                    lambda: not self.gate or self.abort_requested or self.owner.lost()
                )
            if self.owner.lost() and not self.abort_requested:
                self.abort_requested = True
                self.owner.abort_by, self.owner.abort_reason = "Temporal", "the fleet lock was broken"
                self._event("aborted", by="Temporal", detail="fleet lock lost")
            if self.abort_requested:
                break
            view = await self._read_fleet()
            if (self.paused or self.abort_requested) and workflow.patched(PATCH_PAUSE_DURING_FLEET_READ):
                continue  # paused (or aborted) while the fleet was read: no engine starts after it
            batch, refusal = pick_batch(queue, view, plan.max_unavailable)
            if not batch:
                iid = queue[0]
                self.p.engines[iid].step, self.p.engines[iid].outcome = "refused", "refused"
                self.p.engines[iid].error = refusal
                failed = refusal
                break
            self._publish(message=f"restarting {', '.join(batch)}")
            results = await asyncio.gather(*(self._child(iid) for iid in batch))
            queue = [i for i in queue if i not in batch]
            bad = [r for r in results if r.outcome != "restarted"]
            if bad:
                failed = "; ".join(f"{r.iid} {r.outcome}: {r.error or r.note}" for r in bad)
            elif self.analysis is not None:  # canary analysis of what was just readmitted
                failed = await self.analysis.judge_batch(batch, self._baseline(view, batch))
        ok = not failed and not queue
        aborted = self.abort_requested or any(e.outcome == "aborted" for e in self.p.engines.values())
        state: RunState = "done" if ok else ("aborted" if aborted else "failed")
        if state == "failed" and self.analysis is not None and self.analysis.failed:
            state = "analysis_failed"
        message = (
            "every engine restarted and readmitted"
            if ok
            else (failed or "aborted before the remaining engines")
        )
        if aborted and self.owner.enabled():
            message = self.owner.aborted_message(message, self.p.engines.values())
        return await self._end(ok, state, message)

    async def _end(self, ok: bool, state: RunState, message: str) -> RestartResult:
        """Final progress + Current Details, the lock released; a run that did not restart every
        engine ends Failed (its reason, and this result as the failure's details)."""
        self.p.message = message
        self.finished = True
        self._publish(state=state, message=message)
        await workflow.wait_condition(workflow.all_handlers_finished)
        await self.owner.release()
        self._publish(state=state, message=message)
        result = RestartResult(
            fleet=self.plan.fleet, mode="rolling", ok=ok, state=state, message=message,
            started_at=self.p.started_at, finished_at=workflow.now().timestamp(), engines=self.p.engines,
            events=self.p.events, analysis=self.p.analysis,
        )  # fmt: skip
        if self.owner.enabled():
            run_outcome(result)  # raises ApplicationError unless every engine was restarted
        return result

    def _baseline(self, view: FleetView, batch: list[str]) -> list[str]:
        """Engines not restarted yet (in the plan or not); with none left, those that passed."""
        fresh = [i for i in view.engines if i not in self.p.engines or self.p.engines[i].outcome == "pending"]
        return baseline_of(view.engines, batch, fresh, self.analysis.passed if self.analysis else [])

    def _canary_due(self, queue: list[str]) -> bool:
        """The canary gate closes once, when the first ``pause_after`` engines are back in service."""
        n = self.plan.pause_after
        if not n or not queue or self._gate_passed:
            return False
        restarted = sum(1 for e in self.p.engines.values() if e.outcome == "restarted")
        if restarted < n:
            return False
        self._gate_passed = True
        return True

    async def _child(self, iid: str) -> EngineProgress:
        plan = self.plan
        inp = EngineRestartInput(
            fleet=plan.fleet, iid=iid, engine_url=plan.engine_urls.get(iid, ""), router=plan.router,
            supervisor=plan.supervisor, deadline_s=plan.deadline_s, deadline_policy=plan.deadline_policy,
            timing=plan.timing, report_to_parent=True,
        )  # fmt: skip
        try:
            result = await workflow.execute_child_workflow(
                EngineRestart.run,
                inp,
                id=engine_workflow_id(plan.fleet, iid),
                static_summary=f"restart {iid} ({plan.fleet})",
                static_details=f"Part of `{fleet_workflow_id(plan.fleet)}`; supervisor `{plan.supervisor.backend}`, "
                f"drain deadline {plan.deadline_s}s, policy `{plan.deadline_policy}`.",
            )
        except WorkflowAlreadyStartedError:
            result = self.p.engines[iid].model_copy(
                update={
                    "step": "failed",
                    "outcome": "failed",
                    "error": f"{engine_workflow_id(plan.fleet, iid)} is already running",
                }
            )
        except ChildWorkflowError as exc:
            result = self.p.engines[iid].model_copy(
                update={"step": "failed", "outcome": "failed", "error": cause_message(exc)}
            )
        self.p.engines[iid] = result
        self._publish()
        return result

    # -- operator controls -------------------------------------------------------------------------

    @workflow.query
    def progress(self) -> RestartProgress:
        return self.p

    @workflow.signal
    def pause(self) -> None:
        if self.paused and self.owner.enabled():
            return  # a second pause changes nothing (and is not recorded twice)
        self.paused = True
        self._event("paused")
        self._publish(message="pause requested: takes effect between engines")

    @workflow.signal
    def resume(self) -> None:
        """Also opens the canary gate."""
        self.paused = False
        self._event("resumed", detail="canary gate opened" if self.gate else "")
        self.gate = False
        self._publish(message="resumed")

    @workflow.signal
    async def engine_progress(self, e: EngineProgress) -> None:
        if e.iid not in self.p.engines or self.p.engines[e.iid].step in FINAL_STEPS:
            return
        self.p.engines[e.iid] = e
        if e.step in WAITING_FOR_OPERATOR and e.iid not in self._waiting:
            self._waiting.add(e.iid)
            self._event("waiting_for_operator", iid=e.iid, detail=e.waiting_for)
        elif e.step not in WAITING_FOR_OPERATOR:
            self._waiting.discard(e.iid)
        self._publish()
        if self.owner.enabled():
            if self.abort_requested and e.step in ABORTABLE and e.iid not in self._abort_sent:
                self._abort_sent.add(e.iid)
                by, why = self.owner.abort_by, self.owner.abort_reason
                await self._forward(e.iid, Decision(kind="abort", by=by, reason=why or "rollout aborted"))
        elif self.abort_requested and e.step in WAITING_FOR_OPERATOR:
            await self._forward(e.iid, Decision(kind="abort", reason="rollout aborted"))

    async def _forward(self, iid: str, d: Decision) -> None:
        handle = workflow.get_external_workflow_handle(engine_workflow_id(self.plan.fleet, iid))
        await handle.signal("decide", d)

    def _target(self, kind: str, req: OperatorRequest) -> str:
        wanted = {"approve": {"awaiting_approval"}, "retry": {"blocked"}}[kind]
        if req.iid:
            e = self.p.engines.get(req.iid)
            if e is None:
                raise ValueError(f"unknown engine {req.iid}")
            if e.step not in wanted:
                raise ValueError(f"{kind}: {req.iid} is {e.step}, not {' or '.join(sorted(wanted))}")
            return req.iid
        waiting = [e.iid for e in self.p.engines.values() if e.step in wanted]
        if not waiting:
            gate = " (the canary gate is already open)" if kind == "approve" and self._gate_passed else ""
            raise ValueError(f"nothing waits for {kind} now{gate}")
        if len(waiting) > 1:
            raise ValueError(
                f"several engines wait for {kind} ({', '.join(waiting)}): name one with --engine"
            )
        return waiting[0]

    async def _decide(self, kind: str, req: OperatorRequest) -> OperatorAnswer:
        if kind == "approve" and self._gate_approvable(req):
            self.gate = False
            self._event(
                "approved", by=req.by, detail="canary gate" + (f": {req.reason}" if req.reason else "")
            )
            self._publish(message=f"canary gate approved by {req.by or 'operator'}")
            return OperatorAnswer(accepted=True, message="canary gate approved: the rollout continues")
        iid = self._target(kind, req)
        self._event("approved" if kind == "approve" else "retried", iid=iid, by=req.by, detail=req.reason)
        if self.owner.enabled():
            self._publish(message=f"{kind} of {iid} by {req.by or 'operator'}")
        before = self.p.engines[iid].decisions
        await self._forward(iid, Decision(kind=kind, by=req.by, reason=req.reason))
        try:
            await workflow.wait_condition(
                lambda: self.p.engines[iid].decisions > before, timeout=timedelta(seconds=60)
            )
        except TimeoutError:
            return OperatorAnswer(accepted=True, message=f"{kind} sent to {iid}; not acknowledged yet")
        return OperatorAnswer(
            accepted=True, message=f"{kind} applied to {iid} (now {self.p.engines[iid].step})"
        )

    @workflow.update
    async def approve(self, req: OperatorRequest) -> OperatorAnswer:
        return await self._decide("approve", req)

    @approve.validator
    def _approve_ok(self, req: OperatorRequest) -> None:
        if not self._gate_approvable(req):
            self._target("approve", req)

    def _gate_approvable(self, req: OperatorRequest) -> bool:
        return self.gate and not req.iid

    @workflow.update
    async def retry(self, req: OperatorRequest) -> OperatorAnswer:
        return await self._decide("retry", req)

    @retry.validator
    def _retry_ok(self, req: OperatorRequest) -> None:
        self._target("retry", req)

    @workflow.update
    async def abort(self, req: OperatorRequest) -> OperatorAnswer:
        """Stop the rollout (no further engines); engines waiting for an operator end held.
        With ``iid``: also abort that engine while it still waits to stop."""
        self.abort_requested = True
        if self.owner.enabled():
            return await self._abort_now(req)
        waiting = [
            e.iid
            for e in self.p.engines.values()
            if e.step in WAITING_FOR_OPERATOR or (e.iid == req.iid and e.step in ABORTABLE)
        ]
        for iid in waiting:
            await self._forward(iid, Decision(kind="abort", by=req.by, reason=req.reason))
        self._event("aborted", iid=req.iid, by=req.by, detail=req.reason)
        self._publish(message="abort requested: no further engines will be restarted")
        held = f"; {', '.join(waiting)} end held" if waiting else ""
        return OperatorAnswer(accepted=True, message=f"abort accepted{held}")

    async def _abort_now(self, req: OperatorRequest) -> OperatorAnswer:
        """The engines in progress stop at their next safe point (held out of placement); the
        rollout starts no further engine."""
        self.owner.abort_by, self.owner.abort_reason = req.by or "operator", req.reason
        self.gate = False
        busy = [e.iid for e in self.p.engines.values() if e.step in ABORTABLE and e.step != "pending"]
        for iid in busy:
            self._abort_sent.add(iid)
            await self._forward(iid, Decision(kind="abort", by=req.by, reason=req.reason))
        late = [e.iid for e in self.p.engines.values() if e.step in IN_PROGRESS and e.iid not in busy]
        self._event("aborted", iid=req.iid, by=req.by, detail=req.reason)
        self._publish(
            message=f"abort requested by {req.by or 'operator'}: no further engines will be restarted"
        )
        parts = [f"{', '.join(busy)} stop at the next safe point and stay held"] if busy else []
        if late:
            parts.append(f"{', '.join(late)} already past the point of no return: finishing its readmission")
        return OperatorAnswer(
            accepted=True, message="abort accepted" + ("; " + "; ".join(parts) if parts else "")
        )

    @abort.validator
    def _abort_ok(self, req: OperatorRequest) -> None:
        if self.finished:
            raise ValueError("the restart already finished")
        if req.iid and req.iid not in self.p.engines:
            raise ValueError(f"unknown engine {req.iid}")
