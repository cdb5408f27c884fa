"""The runbook steps (spec §13) shared by ``EngineRestart`` (one engine) and ``WaveRestart``
(every engine as one set): drain → wait until safe to stop → restart → wait for the newer
process → readmit (waiting for an operator on refusal) → confirm serving.

Deterministic workflow code: every side effect is an activity, time is ``workflow.now()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    FailureError,
    RetryState,
)
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from activities.errors import NON_RETRYABLE
    from activities.router import LifecycleActivities
    from activities.supervisor import SupervisorActivities
    from narwhal_models.restart import (
        FINAL_STEPS,
        WAITING_FOR_OPERATOR,
        ConfirmRequest,
        DeadlinePolicy,
        Decision,
        DrainRequest,
        EngineProgress,
        EngineTarget,
        LaunchReport,
        OperatorAnswer,
        OperatorEvent,
        OperatorRequest,
        ReadmitRequest,
        RouterRef,
        StartEngineRequest,
        Step,
        StopWait,
        StopWaitRequest,
        SupervisorRef,
        Timing,
    )
    from workflows.details import render

FLEET_KEY = SearchAttributeKey.for_keyword("NarwhalFleet")
STATE_KEY = SearchAttributeKey.for_keyword("NarwhalState")
MAX_CAPTURE_ATTEMPTS = 30
# workflow.patched id: a restart-timeout expiry blocks the engine for the operator (was: failed).
PATCH_RESTART_TIMEOUT_BLOCKS = "restart-timeout-blocks"
# workflow.patched id: probe before launching, one-attempt launch reported by signal (exactly once).
PATCH_EXACTLY_ONCE_LAUNCH = "exactly-once-launch"
MAX_LAUNCH_ATTEMPTS = 5
MAX_EVENTS = 50
MIN_NEW_PROCESS_WAIT_S = 5.0
SAME_PROCESS_TOLERANCE = 1e-6
# Steps an abort stops at a safe point: before the drain, during it, while waiting to stop, while a
# restart runs (a launched restart command is awaited, never killed; the newer process is not waited
# for) and while blocked. Not while readmitting/confirming: that engine finishes its readmission.
ABORTABLE: frozenset[str] = frozenset(
    {
        "pending",
        "draining",
        "waiting_to_stop",
        "awaiting_approval",
        "blocked",
        "restarting",
        "waiting_for_new_process",
    }
)
IN_PROGRESS: frozenset[str] = frozenset(
    {"draining", "waiting_to_stop", "awaiting_approval", "restarting", "waiting_for_new_process"}
    | {"readmitting", "confirming", "blocked"}
)


def cause_message(exc: BaseException) -> str:
    """The innermost failure message of an activity/child error."""
    while isinstance(exc, ActivityError | ChildWorkflowError) and exc.cause is not None:
        exc = exc.cause
    text = exc.message if isinstance(exc, FailureError) else str(exc)  # without the "Type: " prefix
    return text or type(exc).__name__


class RunbookSteps:
    """State + steps; concrete workflows add the Temporal decorators and handlers."""

    def _setup(
        self,
        *,
        fleet: str,
        router: RouterRef,
        supervisor: SupervisorRef,
        timing: Timing,
        deadline_s: float,
        deadline_policy: DeadlinePolicy,
        engine_urls: dict[str, str],
    ) -> None:
        self.fleet = fleet
        self.router = router
        self.supervisor = supervisor
        self.timing = timing
        self.deadline_s = deadline_s
        self.deadline_policy: DeadlinePolicy = deadline_policy
        self.engine_urls = engine_urls
        self.engines: dict[str, EngineProgress] = {}
        self.decision: Decision | None = None
        self.consumed = 0
        self.finished = False
        self._sa_state = ""
        self.wave_id = ""
        self.started_at: float | None = None
        self.events: list[OperatorEvent] = []
        self.launch_seq: dict[str, int] = {}
        self.launches: dict[str, LaunchReport] = {}
        self.abort_taken: Decision | None = None

    # -- bookkeeping ---------------------------------------------------------------------------

    def now(self) -> float:
        return workflow.now().timestamp()

    def state_keyword(self) -> str:
        raise NotImplementedError

    def header(self) -> str:
        return f"**{self.fleet}**"

    async def on_change(self) -> None:
        """Hook: EngineRestart reports to its parent."""

    def details(self) -> str:
        """Current Details; concrete workflows give the title and state."""
        return render(self.header(), self.state_keyword(), self.engines.values(), self.started_at, self.now())

    async def publish(self) -> None:
        workflow.set_current_details(self.details())
        state = self.state_keyword()
        if state != self._sa_state:
            self._sa_state = state
            workflow.upsert_search_attributes([STATE_KEY.value_set(state)])
        await self.on_change()

    async def step(self, iids: Iterable[str], step: Step, note: str = "", error: str | None = None) -> None:
        now = self.now()
        for iid in iids:
            e = self.engines[iid]
            if e.step_started_at is not None and e.step != step:
                e.timings[e.step] = round(e.timings.get(e.step, 0.0) + now - e.step_started_at, 3)
            if e.started_at is None:
                e.started_at = now
            if e.step != step:
                e.step_started_at = now
                e.step_times.setdefault(step, now)
            e.step = step
            e.note = note
            if error is not None:
                e.error = error
            if step == "done":
                e.outcome, e.finished_at = "restarted", now
            elif step in ("aborted", "failed", "refused"):
                e.outcome, e.finished_at = step, now
            else:
                e.outcome = "running"
        await self.publish()

    # -- operator decisions --------------------------------------------------------------------

    def note_event(self, kind: str, iid: str = "", by: str = "", detail: str = "") -> None:
        """An operator event (kept: the last ``MAX_EVENTS``) for the UI, ``status`` and ``--follow``."""
        self.events.append(OperatorEvent(at=self.now(), kind=kind, iid=iid, by=by, detail=detail))
        del self.events[:-MAX_EVENTS]

    def validate_decision(self, kind: str, req: OperatorRequest) -> None:
        targets = [e for e in self.engines.values() if not req.iid or e.iid == req.iid]
        if req.iid and not targets:
            raise ValueError(f"unknown engine {req.iid}")
        allowed = {"approve": {"awaiting_approval"}, "retry": {"blocked"}, "abort": ABORTABLE}[kind]
        if not any(e.step in allowed for e in targets):
            now = ", ".join(f"{e.iid}: {e.step}" for e in targets)
            raise ValueError(f"{kind} is not applicable now ({now}); it needs a step in {sorted(allowed)}")

    async def apply_decision(self, kind: str, req: OperatorRequest) -> OperatorAnswer:
        before = self.consumed
        self.decision = Decision(kind=kind, by=req.by, reason=req.reason)
        await workflow.wait_condition(lambda: self.consumed > before or self.finished)
        steps = ", ".join(f"{e.iid}: {e.step}" for e in self.engines.values())
        return OperatorAnswer(accepted=True, message=f"{kind} applied ({steps})")

    def decision_applicable(self, d: Decision) -> bool:
        try:
            self.validate_decision(d.kind, OperatorRequest(by=d.by, reason=d.reason))
        except ValueError:
            return False
        return True

    async def take_decision(self, iids: list[str], allowed: set[str]) -> Decision:
        await workflow.wait_condition(lambda: self.decision is not None and self.decision.kind in allowed)
        assert self.decision is not None
        d, self.decision = self.decision, None
        self.consumed += 1
        if d.kind == "abort":
            self.abort_taken = d
        for iid in iids:
            e = self.engines[iid]
            e.decisions += 1
            e.waiting_for = ""
            e.note = f"{d.kind} by {d.by or 'operator'}" + (f": {d.reason}" if d.reason else "")
        kind = {"approve": "approved", "retry": "retried", "abort": "aborted"}[d.kind]
        self.note_event(kind, iid=",".join(iids) if len(iids) == 1 else "", by=d.by, detail=d.reason)
        return d

    def abort_pending(self) -> bool:
        return self.abort_taken is not None or (self.decision is not None and self.decision.kind == "abort")

    async def abort_engines(self, iids: list[str], what: str) -> None:
        """End ``iids`` as aborted, saying what really happened to them."""
        if self.abort_taken is None:
            self.abort_taken = await self.take_decision(iids, {"abort"})
        d = self.abort_taken
        who = f"abort by {d.by or 'operator'}" + (f": {d.reason}" if d.reason else "")
        await self.step(iids, "aborted", note=f"{what} ({who})")

    async def wait_operator(
        self, iids: list[str], step: Step, waiting_for: str, allowed: set[str]
    ) -> Decision:
        for iid in iids:
            self.engines[iid].waiting_for = waiting_for
        self.note_event("waiting_for_operator", iid=self.names(iids), detail=waiting_for)
        await self.step(iids, step, note=self.engines[iids[0]].note)
        return await self.take_decision(iids, allowed)

    # -- activity options ----------------------------------------------------------------------

    def call_retry(self) -> RetryPolicy:
        return RetryPolicy(
            initial_interval=timedelta(seconds=1),
            backoff_coefficient=2.0,
            maximum_interval=timedelta(seconds=10),
            non_retryable_error_types=list(NON_RETRYABLE),
        )

    def poll_retry(self) -> RetryPolicy:
        return RetryPolicy(
            initial_interval=timedelta(seconds=self.timing.poll_interval_s),
            backoff_coefficient=1.0,
            maximum_attempts=0,
            non_retryable_error_types=list(NON_RETRYABLE),
        )

    def heartbeat(self) -> timedelta:
        return timedelta(seconds=self.timing.heartbeat_timeout_s)

    def call_start_to_close(self) -> timedelta:
        return timedelta(seconds=self.router.request_timeout_s * 4 + 10)

    def call_schedule_to_close(self) -> timedelta:
        return timedelta(seconds=self.timing.router_call_timeout_s)

    def names(self, iids: list[str]) -> str:
        return iids[0] if len(iids) == 1 else f"{len(iids)} engines"

    # -- the runbook ---------------------------------------------------------------------------

    async def drain(self, iids: list[str], wave: bool) -> bool:
        """Drain; on an identity-capture 503, make the engines answer and repeat the same drain."""
        await self.step(iids, "draining")
        for attempt in range(1, MAX_CAPTURE_ATTEMPTS + 1):
            try:
                out = await workflow.execute_activity_method(
                    LifecycleActivities.drain,
                    DrainRequest(
                        router=self.router,
                        engines=iids,
                        wave=wave,
                        deadline_s=self.deadline_s,
                        supervisor=self.supervisor,  # the worker refuses an unknown template first
                    ),
                    retry_policy=self.call_retry(),
                    summary=f"drain {'wave' if wave else self.names(iids)}",
                    start_to_close_timeout=self.call_start_to_close(),
                    schedule_to_close_timeout=self.call_schedule_to_close(),
                    heartbeat_timeout=self.heartbeat(),
                )
            except ActivityError as exc:
                await self.step(iids, "failed", error=f"drain failed: {cause_message(exc)}")
                return False
            for iid in iids:
                if (view := out.engines.get(iid)) is not None:
                    self.engines[iid].router_state = view.state
                    if view.old_process_start is not None:
                        self.engines[iid].old_process_start = view.old_process_start
            if not out.capture_failures:
                self.wave_id = out.wave_id
                return True
            failed = sorted(i for i in out.capture_failures if i in self.engines) or iids
            why = "; ".join(f"{i}: {m}" for i, m in sorted(out.capture_failures.items()))
            await self.step(failed, "draining", note=f"identity capture failed (attempt {attempt}): {why}")
            for iid in failed:
                await workflow.execute_activity_method(
                    SupervisorActivities.start_engine,
                    StartEngineRequest(iid=iid, supervisor=self.supervisor),
                    retry_policy=self.call_retry(),
                    start_to_close_timeout=timedelta(seconds=90),
                    heartbeat_timeout=self.heartbeat(),
                    summary=f"start {iid} for identity capture",
                )
            await workflow.sleep(
                timedelta(seconds=self.timing.poll_interval_s), summary="before repeating the drain"
            )
        await self.step(iids, "failed", error="identity capture kept failing; engines stay held")
        return False

    def _stop_wait(
        self, iids: list[str], wave: bool, stop_on_deadline: bool
    ) -> workflow.ActivityHandle[StopWait]:
        return workflow.start_activity_method(
            LifecycleActivities.wait_ready_to_stop,
            StopWaitRequest(
                router=self.router,
                engines=iids,
                wave=wave,
                stop_on_deadline=stop_on_deadline,
                poll_interval_s=self.timing.poll_interval_s,
            ),
            schedule_to_close_timeout=timedelta(days=7),
            heartbeat_timeout=timedelta(seconds=self.timing.heartbeat_timeout_s),
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            retry_policy=self.call_retry(),
            summary=f"wait for {'the wave' if wave else self.names(iids)} to stop",
        )

    async def wait_to_stop(self, iids: list[str], wave: bool) -> bool:
        """Until ready_to_stop. Past the drain deadline: policy wait / fail / approve."""
        stop_on_deadline = self.deadline_policy != "wait"
        approved = False
        while True:
            if not approved:
                await self.step(iids, "waiting_to_stop")
            poll = self._stop_wait(iids, wave, stop_on_deadline)
            allowed = {"abort", "approve"} if not stop_on_deadline else {"abort"}
            await workflow.wait_condition(
                lambda poll=poll, allowed=allowed: (
                    poll.done()  # type: ignore[misc]
                    or (self.decision is not None and self.decision.kind in allowed)
                )
            )
            if not poll.done():
                d = await self.take_decision(iids, allowed)
                poll.cancel()
                try:
                    await poll
                except (ActivityError, asyncio.CancelledError):
                    pass
                if d.kind == "abort":
                    await self.step(iids, "aborted", note="aborted while draining; engines stay held")
                    return False
                return True  # approved: proceed despite resident requests
            try:
                res = poll.result()
            except ActivityError as exc:
                await self.step(iids, "failed", error=f"waiting to stop failed: {cause_message(exc)}")
                return False
            for iid in iids:
                if iid in res.engines:
                    self.engines[iid].router_state = res.engines[iid].state
            status, message = res.status, res.message
            if status == "ready_to_stop":
                return True
            if status == "deadline_exceeded" and self.deadline_policy == "approve":
                for iid in iids:
                    self.engines[iid].waiting_for = "approve (restart despite resident requests) or abort"
                self.note_event(
                    "waiting_for_operator",
                    iid=self.names(iids),
                    detail="drain deadline exceeded: approve or abort",
                )
                await self.step(iids, "awaiting_approval", note=f"drain deadline exceeded: {message}")
                stop_on_deadline = False
                approved = True  # from now on: approve, abort, or the drain completes by itself
                continue
            if status == "deadline_exceeded":
                await self.step(iids, "failed", error=f"drain deadline exceeded (policy fail): {message}")
                return False
            await self.step(iids, "failed", error=f"engine left the drain: {message}")
            return False

    async def restart_one(self, iid: str) -> bool | None:
        """Restart through the backend, then wait for a newer process (bounded by the restart
        timeout). True: a newer process serves; False: failed; None: none within the timeout."""
        e = self.engines[iid]
        assert e.old_process_start is not None
        if self.abort_pending():
            await self.abort_engines([iid], "not restarted: aborted before its restart command; stays held")
            return False
        target = EngineTarget(
            iid=iid, url=self.engine_urls.get(iid, ""), old_process_start=e.old_process_start,
            supervisor=self.supervisor,
        )  # fmt: skip
        limit = self.timing.new_process_timeout_s
        if workflow.patched(PATCH_EXACTLY_ONCE_LAUNCH):
            launched_at = await self.launch_once(iid, target)
            if launched_at is None:
                return False
            wait_s = max(limit - (self.now() - launched_at), MIN_NEW_PROCESS_WAIT_S)
        else:
            try:
                out = await workflow.execute_activity_method(
                    SupervisorActivities.restart_engine,
                    target,
                    start_to_close_timeout=timedelta(seconds=self.timing.restart_timeout_s),
                    heartbeat_timeout=self.heartbeat(),
                    retry_policy=RetryPolicy(
                        maximum_attempts=5, non_retryable_error_types=list(NON_RETRYABLE)
                    ),
                    summary=f"restart {iid} ({self.supervisor.backend})",
                )
                e.restarted_by_us = e.restarted_by_us or out.restarted
                manual = self.supervisor.backend == "manual"
                await self.step([iid], "waiting_for_new_process", note=out.note if manual else "")
            except ActivityError as exc:
                await self.step([iid], "failed", error=f"restart failed: {cause_message(exc)}")
                return False
            wait_s = limit
        if self.abort_pending():
            await self.abort_engines(
                [iid], "restart aborted: its restart command was awaited to its end; the newer process "
                "was not waited for and the engine stays held",
            )  # fmt: skip
            return False
        poll = workflow.start_activity_method(
            SupervisorActivities.wait_new_process,
            target,
            start_to_close_timeout=timedelta(seconds=30),
            schedule_to_close_timeout=timedelta(seconds=wait_s),
            heartbeat_timeout=self.heartbeat(),  # an attempt lost with its worker: retried then
            retry_policy=self.poll_retry(),
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=f"wait for {iid} to serve a new process (up to {limit:g}s)",
        )
        await workflow.wait_condition(lambda: poll.done() or self.abort_pending())
        if not poll.done():
            poll.cancel()
            try:
                await poll
            except (ActivityError, asyncio.CancelledError):
                pass
            await self.abort_engines(
                [iid], "restart aborted while waiting for its newer process (the restart command had "
                "returned); not readmitted, stays held",
            )  # fmt: skip
            return False
        try:
            new = poll.result()
        except ActivityError as exc:
            # Poll-by-retry past schedule_to_close ends with retry state TIMEOUT (cause: the last
            # NotReadyYet, or a TimeoutError when an attempt was cut off).
            if exc.retry_state == RetryState.TIMEOUT and workflow.patched(PATCH_RESTART_TIMEOUT_BLOCKS):
                e.error = f"no newer process within the restart timeout ({limit:g}s); last check: " + (
                    cause_message(exc)
                )
                return None
            await self.step([iid], "failed", error=f"restart failed: {cause_message(exc)}")
            return False
        e.new_process_start = new.process_start
        return True

    # -- exactly-once launches ------------------------------------------------------------------

    def record_launch(self, r: LaunchReport) -> None:
        """Signal ``launch_started`` from the restart activity, sent before it launches anything."""
        if r.iid in self.engines and r.launch == self.launch_seq.get(r.iid, 0):
            self.launches[r.iid] = r

    def launched(self, iid: str, launch: int) -> LaunchReport | None:
        r = self.launches.get(iid)
        return r if r is not None and r.launch == launch else None

    async def launch_once(self, iid: str, target: EngineTarget) -> float | None:
        """Launch the restart at most once; returns when it was launched (workflow time), or None
        when the restart failed.

        Before each launch the engine's live process is probed: a process newer than the drain
        record means the restart already happened (skip). The restart activity has one attempt and
        reports the launch durably (signal ``launch_started``) before it runs anything; when the
        attempt is lost (worker killed: heartbeat timeout), a reported launch is never repeated —
        the workflow waits for the newer process, within the restart timeout — and an unreported
        one provably never ran, so it is launched again."""
        e = self.engines[iid]
        old = target.old_process_start
        last = ""
        for _ in range(MAX_LAUNCH_ATTEMPTS):
            probe = await workflow.execute_activity_method(
                SupervisorActivities.probe_process,
                target,
                start_to_close_timeout=timedelta(seconds=30),
                schedule_to_close_timeout=timedelta(seconds=max(self.timing.restart_timeout_s, 60)),
                heartbeat_timeout=self.heartbeat(),
                retry_policy=self.call_retry(),
                summary=f"which process does {iid} run?",
            )
            if probe.process_start is not None and probe.process_start > old + SAME_PROCESS_TOLERANCE:
                await self.step(
                    [iid], "waiting_for_new_process", note="already runs a newer process: not launched"
                )
                return self.now()
            self.launch_seq[iid] = self.launch_seq.get(iid, 0) + 1
            n = self.launch_seq[iid]
            try:
                out = await workflow.execute_activity_method(
                    SupervisorActivities.restart_engine,
                    target.model_copy(update={"launch": n}),
                    start_to_close_timeout=timedelta(seconds=self.timing.restart_timeout_s),
                    heartbeat_timeout=self.heartbeat(),
                    retry_policy=RetryPolicy(maximum_attempts=1),
                    summary=f"restart {iid} ({self.supervisor.backend}, launch {n})",
                )
            except ActivityError as exc:
                cause = exc.cause
                kind = cause.type if isinstance(cause, ApplicationError) else ""
                if kind in NON_RETRYABLE:
                    await self.step([iid], "failed", error=f"restart failed: {cause_message(exc)}")
                    return None
                report = self.launched(iid, n)
                if report is not None:
                    await self.step(
                        [iid], "waiting_for_new_process",
                        note=f"launch {n} recorded, its activity was lost ({cause_message(exc)}): not repeated",
                    )  # fmt: skip
                    return report.at if report.at <= self.now() else self.now()
                last = cause_message(exc)
                await self.step([iid], "restarting", note=f"launch {n} never started ({last}): trying again")
                await workflow.sleep(
                    timedelta(seconds=self.timing.poll_interval_s), summary="before launching again"
                )
                continue
            e.restarted_by_us = e.restarted_by_us or out.restarted
            manual = self.supervisor.backend == "manual"
            await self.step(
                [iid], "waiting_for_new_process", note=out.note if manual or not out.restarted else ""
            )
            report = self.launched(iid, n)
            return report.at if report is not None and report.at <= self.now() else self.now()
        await self.step(
            [iid], "failed", error=f"restart failed: {MAX_LAUNCH_ATTEMPTS} launches never started ({last})"
        )
        return None

    async def restart(self, iids: list[str]) -> bool:
        """Restart in parallel. Engines with no newer process within the restart timeout are
        blocked until the operator retries (restart again, guarded, and wait again) or aborts."""
        if self.abort_pending():
            await self.abort_engines(iids, "not restarted: aborted before its restart; stays held (drained)")
            return False
        await self.step(iids, "restarting")
        pending = list(iids)
        while True:
            results = await asyncio.gather(*(self.restart_one(i) for i in pending))
            late = [i for i, r in zip(pending, results, strict=True) if r is None]
            if self.abort_pending():
                rest = [i for i in pending if self.engines[i].step not in FINAL_STEPS]
                if rest:
                    await self.abort_engines(rest, "restart aborted: no newer process confirmed; stays held")
                return False
            if any(r is False for r in results):
                if late:
                    await self.step(late, "failed")
                return False
            if not late:
                return True
            d = await self.wait_operator(late, "blocked", "retry (after repair) or abort", {"retry", "abort"})
            if d.kind == "abort":
                await self.step(late, "aborted", note="aborted: no newer process; engine stays held")
                return False
            pending = late
            await self.step(pending, "restarting")

    async def readmit(self, iids: list[str], wave: bool) -> bool:
        """Readmit + confirm. A refusal leaves the engines blocked and waits for retry / abort."""
        while True:
            await self.step(iids, "readmitting")
            olds = {i: s for i in iids if (s := self.engines[i].old_process_start) is not None}
            error = ""
            try:
                out = await workflow.execute_activity_method(
                    LifecycleActivities.readmit,
                    ReadmitRequest(router=self.router, engines=iids, wave=wave, old_process_starts=olds),
                    retry_policy=self.call_retry(),
                    summary=f"readmit {'wave' if wave else self.names(iids)}",
                    start_to_close_timeout=self.call_start_to_close(),
                    schedule_to_close_timeout=self.call_schedule_to_close(),
                    heartbeat_timeout=self.heartbeat(),
                )
                for iid in iids:
                    if (v := out.engines.get(iid)) is not None:
                        self._record_view(iid, v.state, v.checks, v.error, v.new_process_start)
                await self.step(iids, "confirming")
                serving = await workflow.execute_activity_method(
                    LifecycleActivities.confirm_active,
                    ConfirmRequest(router=self.router, engines=iids, require_ready=wave),
                    start_to_close_timeout=timedelta(seconds=self.router.request_timeout_s * 3 + 5),
                    schedule_to_close_timeout=timedelta(seconds=self.timing.confirm_timeout_s),
                    heartbeat_timeout=self.heartbeat(),
                    retry_policy=self.poll_retry(),
                    summary=f"confirm {self.names(iids)} active and accepting",
                )
                for iid in iids:
                    if iid in serving.engines:
                        self.engines[iid].accepts_new = serving.engines[iid].accepts_new
                        self.engines[iid].build = serving.engines[iid].build
                await self.step(iids, "done", error="")
                return True
            except ActivityError as exc:
                error = cause_message(exc)
                self._record_failure(iids, exc)
            d = await self.wait_operator(iids, "blocked", "retry (after repair) or abort", {"retry", "abort"})
            if d.kind == "abort":
                await self.step(iids, "aborted", note="aborted: engine stays held (blocked)", error=error)
                return False

    def _record_view(self, iid: str, state: str, checks: list[str], error: str, new: float | None) -> None:
        e = self.engines[iid]
        e.router_state, e.checks, e.error = state, list(checks), error
        if new is not None:
            e.new_process_start = new

    def _record_failure(self, iids: list[str], exc: ActivityError) -> None:
        cause = exc.cause
        per_engine: dict[str, dict[str, object]] = {}
        if isinstance(cause, ApplicationError) and cause.details and isinstance(cause.details[0], dict):
            per_engine = cause.details[0].get("engines", {}) or {}
        for iid in iids:
            e = self.engines[iid]
            info = per_engine.get(iid) or {}
            e.router_state = str(info.get("state", e.router_state))
            checks = info.get("checks")
            e.checks = [str(c) for c in checks] if isinstance(checks, list) else e.checks
            e.error = str(info.get("error") or cause_message(exc))

    def any_waiting(self) -> bool:
        return any(e.step in WAITING_FOR_OPERATOR for e in self.engines.values())
