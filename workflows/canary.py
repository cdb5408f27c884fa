"""Canary analysis as durable steps of a rolling restart (``--analysis FILE``).

After a batch is back in service: bake (a timer), then one ``sample_evidence`` activity per
window reading every router's cumulative per-engine counters; the workflow differences them and
judges each restarted engine against the baseline (engines not restarted yet) with the pure
functions of workflows/analysis.py. The samples are activity results in the history and the
verdicts a deterministic function of them; each verdict is also the summary of the next timer, so
the history reads as the analysis went. The verdicts act:

- every engine of the batch passed ``samples`` windows → the rollout goes on;
- an engine failed ``failure_limit`` windows → it is drained again (held out of placement, its
  process kept for inspection), the rollout stops and the run ends ``analysis_failed`` with the
  evidence;
- more than ``inconclusive_limit`` windows without enough traffic → the run waits for the operator
  like the canary gate (``approve`` or ``resume`` continues; ``abort`` stops).

With a rollback template in the plan (``--rollback-template NAME``, a template of the worker's
configuration), each held engine is then put back: the worker runs the template for it
(``rollback_engine``, one attempt), the workflow waits for a process newer than the held one and
readmits it through the normal checks. The run still ends ``analysis_failed`` with the evidence;
its message says whether the engine was rolled back and readmitted or stays held.

Workflow code: deterministic, no I/O but through activities.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.errors import NON_RETRYABLE
    from activities.evidence import EvidenceActivities
    from activities.router import LifecycleActivities
    from activities.supervisor import SupervisorActivities
    from narwhal_models.evidence import AnalysisPolicy, EvidenceSnapshot
    from narwhal_models.restart import (
        ConfirmRequest,
        DrainRequest,
        EngineTarget,
        ReadmitRequest,
        RestartPlan,
        RestartProgress,
        RollbackRequest,
        RunState,
    )
    from workflows.analysis import Tally, TallyState, judge, window
    from workflows.analysis_text import verdict_line
    from workflows.steps import cause_message

MAX_SAMPLES = 60  # samples kept in the progress document (Current Details shows the last few)


class AnalysisHost(Protocol):
    """What the analysis needs of the rolling restart that runs it."""

    plan: RestartPlan
    p: RestartProgress
    gate: bool
    abort_requested: bool

    def _publish(self, state: RunState | None = None, message: str | None = None) -> None: ...

    def _event(self, kind: str, iid: str = "", by: str = "", detail: str = "") -> None: ...


def _retry() -> RetryPolicy:
    return RetryPolicy(
        initial_interval=timedelta(seconds=1),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=10),
        non_retryable_error_types=list(NON_RETRYABLE),
    )


class CanaryAnalysis:
    def __init__(self, host: AnalysisHost, policy: AnalysisPolicy) -> None:
        self.host = host
        self.policy = policy
        self.failed = False  # an analysis failed: the run ends analysis_failed
        self.passed: list[str] = []  # engines whose analysis passed (a baseline when none is left)

    async def _wait(self, seconds: float, summary: str) -> bool:
        """A timer (recorded with ``summary``) that an abort cuts short; True when aborted."""
        h = self.host
        if seconds <= 0:
            return h.abort_requested
        try:
            await workflow.wait_condition(lambda: h.abort_requested, timeout=seconds, timeout_summary=summary)
        except TimeoutError:
            return False
        return True

    async def _sample(self, what: str) -> EvidenceSnapshot:
        ref = self.host.plan.router
        return await workflow.execute_activity_method(
            EvidenceActivities.sample_evidence,
            ref,
            retry_policy=_retry(),
            start_to_close_timeout=timedelta(seconds=ref.request_timeout_s * len(ref.routers) + 10),
            schedule_to_close_timeout=timedelta(seconds=self.host.plan.timing.router_call_timeout_s),
            summary=what,
        )

    async def judge_batch(self, batch: list[str], baseline: list[str]) -> str:
        """Bake, sample, judge. Returns "" when the batch may stay (passed, approved, or the run was
        aborted meanwhile) or the failure message (the failing engines are held)."""
        h, policy = self.host, self.policy
        names = ", ".join(batch)
        vs = ", ".join(baseline) or "no baseline"
        h._publish(message=f"canary analysis of {names} against {vs}: baking {policy.bake_s:g} s")
        if await self._wait(policy.bake_s, f"bake {names} for {policy.bake_s:g} s after readmission"):
            return ""
        prev = await self._sample(f"analysis: counters at the start of window 1 ({names})")
        tallies = {iid: Tally() for iid in batch}
        states: dict[str, TallyState] = {iid: "continue" for iid in batch}
        last = "first window"
        index = 0
        while True:
            index += 1
            summary = f"analysis window {index} of {names} ({policy.interval_s:g} s); before: {last}"
            if await self._wait(policy.interval_s, summary[:400]):
                return ""
            cur = await self._sample(f"analysis: counters at the end of window {index} ({names})")
            w = window(prev, cur)
            prev = cur
            lines: list[str] = []
            for iid in batch:
                if states[iid] != "continue":
                    continue
                s = judge(index, w, [iid], baseline, policy)
                h.p.analysis.append(s)
                del h.p.analysis[:-MAX_SAMPLES]
                states[iid] = tallies[iid].record(s.verdict, policy)
                lines.append(verdict_line(s))
            last = " | ".join(lines)
            failed = [i for i in batch if states[i] == "failed"]
            if failed:
                return await self._hold(failed)
            if all(states[i] == "passed" for i in batch):
                self.passed += batch
                h._publish(message=f"canary analysis passed for {names}: {last}")
                return ""
            asking = [i for i in batch if states[i] == "ask_operator"]
            if asking:
                if not await self._ask(asking, last):
                    return ""
                self.passed += batch
                return ""
            h._publish(message=f"canary analysis of {names}: {last}")

    async def _ask(self, iids: list[str], last: str) -> bool:
        """Too little traffic to judge: wait for the operator like the canary gate. True: approved."""
        h = self.host
        names = ", ".join(iids)
        h.gate = True
        h._event(
            "waiting_for_operator",
            iid=iids[0] if len(iids) == 1 else "",
            detail=f"canary analysis of {names} inconclusive (too little traffic): approve to continue",
        )
        h._publish(
            message=f"canary analysis of {names} inconclusive beyond inconclusive_limit "
            f"{self.policy.inconclusive_limit}: waiting for the operator (approve or resume continues) — {last}"
        )
        await workflow.wait_condition(lambda: not h.gate or h.abort_requested)
        return not h.abort_requested

    async def _hold(self, failed: list[str]) -> str:
        """Drain the failing engines again: out of placement, their process kept for inspection."""
        h = self.host
        self.failed = True
        evidence = {s.engines[0]: s for s in h.p.analysis if s.verdict == "fail" and s.engines[0] in failed}
        held = "drained again and held out of placement"
        states: dict[str, str] = {}
        olds: dict[str, float] = {}
        try:
            out = await workflow.execute_activity_method(
                LifecycleActivities.drain,
                DrainRequest(router=h.plan.router, engines=failed, deadline_s=h.plan.deadline_s),
                retry_policy=_retry(),
                summary=f"hold {', '.join(failed)}: canary analysis failed",
                start_to_close_timeout=timedelta(seconds=h.plan.router.request_timeout_s * 4 + 10),
                schedule_to_close_timeout=timedelta(seconds=h.plan.timing.router_call_timeout_s),
                heartbeat_timeout=timedelta(seconds=h.plan.timing.heartbeat_timeout_s),
            )
            states = {i: v.state for i, v in out.engines.items()}
            olds = {i: v.old_process_start for i, v in out.engines.items() if v.old_process_start is not None}
        except ActivityError as exc:
            held = f"could not be held out of placement ({cause_message(exc)})"
        rolled: dict[str, str] = {}
        if h.plan.rollback_template and states:
            for iid in failed:
                rolled[iid] = await self._rollback(iid, olds.get(iid, h.p.engines[iid].new_process_start))
        now = workflow.now().timestamp()
        for iid in failed:
            e = h.p.engines[iid]
            e.step, e.outcome, e.finished_at = "failed", "failed", now
            e.router_state = states.get(iid, e.router_state)
            why = "; ".join(evidence[iid].reasons) if iid in evidence else "analysis failed"
            e.error = f"canary analysis failed: {why}"
            e.note = f"restarted, then {held}" + (f"; {rolled[iid]}" if iid in rolled else "")
        parts = [verdict_line(evidence[i]) for i in failed if i in evidence]
        after = "".join(f"; {i} {rolled[i]}" for i in failed if i in rolled)
        return f"canary analysis failed, rollout stopped; {', '.join(failed)} {held}{after}: " + " | ".join(
            parts
        )

    async def _rollback(self, iid: str, held: float | None) -> str:
        """The plan's rollback template for a held engine, a newer process, the normal readmission
        checks. Returns what happened (for the message and the engine's note)."""
        h = self.host
        plan, name = h.plan, h.plan.rollback_template
        e = h.p.engines[iid]
        if held is None:
            return "not rolled back: no process start recorded for the held process; stays held"
        url = plan.engine_urls.get(iid, "")
        beat = timedelta(seconds=plan.timing.heartbeat_timeout_s)
        call = timedelta(seconds=plan.router.request_timeout_s * 4 + 10)
        h._publish(message=f"canary analysis failed for {iid}: rolling it back (template {name})")
        try:
            await workflow.execute_activity_method(
                SupervisorActivities.rollback_engine,
                RollbackRequest(iid=iid, url=url, template=name, supervisor=plan.supervisor),
                start_to_close_timeout=timedelta(seconds=plan.timing.restart_timeout_s),
                heartbeat_timeout=beat,
                retry_policy=RetryPolicy(maximum_attempts=1),  # a command runs once
                summary=f"roll back {iid}: template {name}",
            )
            new = await workflow.execute_activity_method(
                SupervisorActivities.wait_new_process,
                EngineTarget(iid=iid, url=url, old_process_start=held, supervisor=plan.supervisor),
                start_to_close_timeout=timedelta(seconds=30),
                schedule_to_close_timeout=timedelta(seconds=plan.timing.new_process_timeout_s),
                heartbeat_timeout=beat,
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=plan.timing.poll_interval_s),
                    backoff_coefficient=1.0,
                    maximum_attempts=0,
                    non_retryable_error_types=list(NON_RETRYABLE),
                ),
                summary=f"wait for {iid} to serve the rolled-back process",
            )
            e.new_process_start = new.process_start
            out = await workflow.execute_activity_method(
                LifecycleActivities.readmit,
                ReadmitRequest(router=plan.router, engines=[iid], old_process_starts={iid: held}),
                retry_policy=_retry(),
                summary=f"readmit {iid} after its rollback",
                start_to_close_timeout=call,
                schedule_to_close_timeout=timedelta(seconds=plan.timing.router_call_timeout_s),
                heartbeat_timeout=beat,
            )
            if (v := out.engines.get(iid)) is not None:
                e.router_state, e.checks = v.state, list(v.checks)
            serving = await workflow.execute_activity_method(
                LifecycleActivities.confirm_active,
                ConfirmRequest(router=plan.router, engines=[iid]),
                start_to_close_timeout=timedelta(seconds=plan.router.request_timeout_s * 3 + 5),
                schedule_to_close_timeout=timedelta(seconds=plan.timing.confirm_timeout_s),
                heartbeat_timeout=beat,
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=plan.timing.poll_interval_s),
                    backoff_coefficient=1.0,
                    maximum_attempts=0,
                    non_retryable_error_types=list(NON_RETRYABLE),
                ),
                summary=f"confirm {iid} active and accepting after its rollback",
            )
        except ActivityError as exc:
            return f"rollback (template {name}) failed: {cause_message(exc)}; stays held"
        if (c := serving.engines.get(iid)) is not None:
            e.accepts_new, e.build, e.router_state = c.accepts_new, c.build, c.state
        build = f" on {e.build}" if e.build else ""
        return f"rolled back (template {name}) and readmitted{build}"
