"""Spec error bodies ``{"error":{"message","type",["code"],["param"]}}`` and their HTTP responses."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

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


def error_response(
    status: int,
    message: str,
    type_: str,
    code: str | None = None,
    param: str | None = None,
    rid: str = "",
) -> web.Response:
    headers = {"content-type": "application/json"}
    if status in _RETRY_STATUSES:
        headers["retry-after"] = "1"
    if rid:
        headers["x-request-id"] = rid
    return web.Response(
        status=status, body=orjson.dumps(error_doc(message, type_, code, param)), headers=headers
    )


def client_error_response(err: ClientError, rid: str = "") -> web.Response:
    return error_response(err.status, err.message, err.type, err.code, err.param, rid)
