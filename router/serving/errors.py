"""Spec error bodies ``{"error":{"message","type",["code"],["param"]}}`` and their response headers."""

from __future__ import annotations

from typing import Any

import orjson

_RETRY_STATUSES = frozenset({429, 503})


class ClientError(Exception):
    """A request the router answers itself with an error (validation, admission, readiness)."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.param = param


def error_doc(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    err: dict[str, Any] = {"message": message, "type": type_}
    if code is not None:
        err["code"] = code
    if param is not None:
        err["param"] = param
    return {"error": err}


def error_headers(status: int, rid: str = "") -> dict[str, str]:
    headers = {"content-type": "application/json"}
    if status in _RETRY_STATUSES:
        headers["retry-after"] = "1"
    if rid:
        headers["x-request-id"] = rid
    return headers


def error_body(err: ClientError) -> bytes:
    return orjson.dumps(error_doc(err.message, err.type, err.code, err.param))
