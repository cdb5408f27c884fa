"""A restart run's outcome as its starter reads it (client side, never in the sandbox).

Only a run that restarted every engine completes; a failed or aborted one fails, its
``RestartResult`` carried as the failure's details (``workflows/owner.py``). Runs recorded before
that completed with ``ok: false``; both read the same here.
"""

from __future__ import annotations

from typing import Any

from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError, FailureError

from narwhal_models.restart import RestartResult


def failure_result(exc: WorkflowFailureError) -> RestartResult | None:
    """The result a failed run carries (None: it failed before it had one, e.g. terminated)."""
    cause = exc.cause
    if isinstance(cause, ApplicationError) and cause.details and isinstance(cause.details[0], dict):
        return RestartResult.model_validate(cause.details[0])
    return None


def failure_line(exc: WorkflowFailureError) -> str:
    """One line: the failure's own message (``preflight: …``, ``aborted by …``), never a traceback."""
    cause = exc.cause
    if isinstance(cause, FailureError) and cause.message:
        return cause.message  # without the "Type: " prefix str() adds
    return str(cause or exc) or type(exc).__name__


async def final_result(handle: WorkflowHandle[Any, Any]) -> RestartResult:
    """The run's ``RestartResult``, whether it completed or failed with one."""
    try:
        res = await handle.result()
    except WorkflowFailureError as exc:
        carried = failure_result(exc)
        if carried is None:
            raise
        return carried
    return res if isinstance(res, RestartResult) else RestartResult.model_validate(res)
