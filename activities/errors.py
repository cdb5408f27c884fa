"""The activities' error taxonomy: ``ApplicationError`` types the workflows branch on.

No I/O imports here, so workflow modules may import it freely.
"""

from __future__ import annotations

from typing import Any

from temporalio.exceptions import ApplicationError

VALIDATION_FAILED = "ValidationFailed"  # 409 on readmit: the engine stays blocked (non-retryable)
UNSAFE_REQUEST = "UnsafeRequest"  # 409/422 on drain: the router refused the request shape
NOT_READY_YET = "NotReadyYet"  # poll-by-retry: the awaited condition does not hold yet
ROUTER_UNAVAILABLE = "RouterUnavailable"  # no router answered as lease holder (retryable)
UNAUTHORIZED = "Unauthorized"  # control token missing or refused (non-retryable)
ENGINE_NOT_FOUND = "EngineNotFound"  # the supervisor does not know the engine (non-retryable)
SUPERVISOR_UNAVAILABLE = "SupervisorUnavailable"  # supervisor API unreachable (retryable)
RESTART_COMMAND_FAILED = "RestartCommandFailed"  # the command backend exited non-zero (non-retryable)
LAUNCH_NOT_RECORDED = "LaunchNotRecorded"  # the launch could not be reported: nothing ran (retry)
WORKER_REFUSED = "WorkerRefused"  # input names what the worker's configuration lacks (non-retryable)
PREFLIGHT_FAILED = "PreflightFailed"  # the worker's own checks before a run drains anything

NON_RETRYABLE: tuple[str, ...] = (
    VALIDATION_FAILED,
    UNSAFE_REQUEST,
    UNAUTHORIZED,
    ENGINE_NOT_FOUND,
    RESTART_COMMAND_FAILED,
    WORKER_REFUSED,
    PREFLIGHT_FAILED,
)


def validation_failed(message: str, engines: dict[str, Any]) -> ApplicationError:
    return ApplicationError(message, {"engines": engines}, type=VALIDATION_FAILED, non_retryable=True)


def unsafe_request(message: str) -> ApplicationError:
    return ApplicationError(message, type=UNSAFE_REQUEST, non_retryable=True)


def not_ready_yet(message: str) -> ApplicationError:
    return ApplicationError(message, type=NOT_READY_YET)


def router_unavailable(message: str) -> ApplicationError:
    return ApplicationError(message, type=ROUTER_UNAVAILABLE)


def unauthorized(message: str) -> ApplicationError:
    return ApplicationError(message, type=UNAUTHORIZED, non_retryable=True)


def worker_refused(message: str) -> ApplicationError:
    return ApplicationError(f"refused by the worker: {message}", type=WORKER_REFUSED, non_retryable=True)


def preflight_failed(message: str) -> ApplicationError:
    return ApplicationError(message, type=PREFLIGHT_FAILED, non_retryable=True)
