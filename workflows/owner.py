"""What every restart run (``RollingRestart``, ``WaveRestart``) does first and last, behind one
``workflow.patched`` id so the recorded histories of older runs still replay:

- first: the worker's preflight (``activities/preflight.py``), then the fleet lock
  (``workflows/fleet_lock.py``) — nothing is drained before both passed;
- last: the lock released, and the run's Temporal status made its outcome (``run_outcome``): only
  a run that restarted every engine completes; a failed one fails with its reason, an aborted one
  fails with ``aborted by NAME: reason`` — the ``RestartResult`` rides along as the failure's details.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, WorkflowAlreadyStartedError
from temporalio.workflow import ChildWorkflowHandle, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from activities.errors import NON_RETRYABLE
    from activities.preflight import PreflightActivities, fleet_lock_owner
    from narwhal_models.restart import (
        EngineProgress,
        FleetLockInput,
        FleetView,
        LockOwnerRequest,
        PreflightRequest,
        RestartPlan,
        RestartResult,
    )
    from workflows.details import outcome_words
    from workflows.fleet_lock import FleetLock
    from workflows.steps import cause_message

# workflow.patched id: preflight from the worker + fleet lock first; run status = outcome at the end
PATCH_FLEET_OWNER = "fleet-owner"
RESTART_FAILED = "RestartFailed"
RESTART_ABORTED = "RestartAborted"
FLEET_BUSY = "FleetBusy"


def run_outcome(result: RestartResult) -> None:
    """Raise (→ Temporal status Failed, with the reason) unless every engine was restarted."""
    if result.ok:
        return
    kind = RESTART_ABORTED if result.state == "aborted" else RESTART_FAILED
    if result.message.startswith("refused: fleet"):
        kind = FLEET_BUSY
    raise ApplicationError(
        result.message, result.model_dump(mode="json", by_alias=True), type=kind, non_retryable=True
    )


class FleetOwner:
    """The run's hold on its fleet (state kept in the workflow instance)."""

    def __init__(self) -> None:
        self.v2 = False
        self.lock_id = ""
        self.held = False
        self.refusal = ""
        self.abort_by = ""
        self.abort_reason = ""
        self._handle: ChildWorkflowHandle[FleetLock, str] | None = None
        self._lost = False
        self._watcher: asyncio.Future[None] | None = None

    def decide(self) -> bool:
        """Call first thing in ``run``: whether this run has the owner behaviour (new runs do)."""
        self.v2 = workflow.patched(PATCH_FLEET_OWNER)
        return self.v2

    def enabled(self) -> bool:
        return self.v2

    def lost(self) -> bool:
        """The lock workflow ended while this run still holds the fleet (someone broke it)."""
        return self.held and self._lost

    async def take(self, plan: RestartPlan) -> FleetView | None:
        """Preflight, then the lock; the fleet's view, or None with ``refusal`` set (nothing touched)."""
        try:
            pre = await workflow.execute_activity_method(
                PreflightActivities.preflight,
                PreflightRequest(
                    router=plan.router,
                    engines=plan.engines,
                    engine_urls=plan.engine_urls,
                    rollback_template=plan.rollback_template,
                ),
                start_to_close_timeout=timedelta(seconds=plan.router.request_timeout_s * 4 + 30),
                retry_policy=RetryPolicy(maximum_attempts=3, non_retryable_error_types=list(NON_RETRYABLE)),
                summary="preflight from the worker: routers, control token, engine addresses",
            )
        except ActivityError as exc:
            self.refusal = cause_message(exc)
            return None
        self.lock_id = pre.lock_id
        me = workflow.info().workflow_id
        try:
            self._handle = await workflow.start_child_workflow(
                FleetLock.run,
                FleetLockInput(identity=pre.identity, owner=me, fleet=plan.fleet),
                id=pre.lock_id,
                parent_close_policy=ParentClosePolicy.TERMINATE,
                static_summary=f"fleet lock of {plan.fleet}, held by {me}",
            )
        except WorkflowAlreadyStartedError:
            owner = await workflow.execute_activity(
                fleet_lock_owner,
                LockOwnerRequest(lock_id=pre.lock_id, fleet=plan.fleet),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary="who holds the fleet lock?",
            )
            self.refusal = owner.message
            return None
        self.held = True
        handle = self._handle
        self._watcher = asyncio.ensure_future(self._watch(handle))
        return pre.view

    async def _watch(self, handle: ChildWorkflowHandle[FleetLock, str]) -> None:
        try:
            await handle
        except Exception:  # terminated / failed: the lock is gone all the same
            pass
        self._lost = True

    async def release(self) -> None:
        """Signal the lock to end and wait (bounded) until it has: the lock then ends Completed;
        if the owner closed first, parent-close policy TERMINATE would end it all the same."""
        if self._handle is not None and self.held and not self._lost:
            await self._handle.signal(FleetLock.release)
            try:
                await workflow.wait_condition(lambda: self._lost, timeout=timedelta(seconds=30))
            except TimeoutError:
                pass
        self.held = False

    def aborted_message(self, fallback: str, engines: Iterable[EngineProgress]) -> str:
        who = self.abort_by or "operator"
        why = self.abort_reason or "no reason given"
        lines = "; ".join(f"{e.iid} {outcome_words(e)}" for e in engines)
        head = f"aborted by {who}: {why}" if self.abort_by or self.abort_reason else fallback
        return head + (f" — {lines}" if lines else "")
