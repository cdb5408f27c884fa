"""HTTP surface of the lifecycle: ``/narwhal/lifecycle`` (GET), ``…/drain`` and ``…/readmit`` (POST),
and ``/narwhal/openapi.json`` for the two POST bodies. Every answer is the lifecycle document; a
body of the wrong shape is 422 with the document and an ``error`` naming the field.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable
from typing import Any, Protocol, TypeVar

import orjson
from aiohttp import web

from router.lifecycle.document import (
    DrainRequest,
    LifecycleDocument,
    ReadmitRequest,
    RequestError,
    document_schema,
    parse_request,
)
from router.tasks import Tasks


class LifecycleEndpoints(Protocol):
    """What the routes need of the lifecycle (``service.LifecycleService``): its document and the two
    mutations, each answering a status and the document."""

    def document(self, error: str = "") -> LifecycleDocument: ...

    async def drain(
        self, engines: Iterable[str], wave: bool, deadline_s: float
    ) -> tuple[int, LifecycleDocument]: ...

    async def readmit(self, engines: Iterable[str], wave: bool) -> tuple[int, LifecycleDocument]: ...


LIFECYCLE = "/narwhal/lifecycle"
T = TypeVar("T")
# Mutations that outlived their HTTP request (strong references keep the tasks alive; never
# cancelled: a mutation runs to its end). Their outcome is the handler's to report.
_detached = Tasks(logging.getLogger("narwhal.lifecycle"))


async def run_to_completion(work: Coroutine[Any, Any, T]) -> T:
    """Run a lifecycle mutation so a client that leaves cannot cancel it halfway.

    The server cancels a handler whose client disconnected; a drain or readmit cancelled mid-way
    would strand its engines (e.g. in ``validating`` for good). The mutation runs as its own task
    and finishes — recording its outcome in the lifecycle — whether or not anyone reads the answer.
    """
    task = _detached.spawn(work, "narwhal-lifecycle-mutation", crash_log=False)
    return await asyncio.shield(task)


def json_response(status: int, doc: LifecycleDocument) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(doc.to_json()), content_type="application/json")


async def _body(request: web.Request) -> Any:
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        return orjson.loads(raw)  # rejects NaN/Infinity literals
    except orjson.JSONDecodeError:
        raise RequestError("request body is not valid JSON") from None


def add_lifecycle_routes(app: web.Application, service: LifecycleEndpoints) -> None:
    async def get_lifecycle(_: web.Request) -> web.Response:
        return json_response(200, service.document())

    async def drain(request: web.Request) -> web.Response:
        try:
            req = parse_request(DrainRequest, await _body(request))
        except RequestError as exc:
            return json_response(422, service.document(str(exc)))
        status, doc = await run_to_completion(service.drain(req.engines, req.wave, req.deadline_s))
        return json_response(status, doc)

    async def readmit(request: web.Request) -> web.Response:
        try:
            req = parse_request(ReadmitRequest, await _body(request))
        except RequestError as exc:
            return json_response(422, service.document(str(exc)))
        status, doc = await run_to_completion(service.readmit(req.engines, req.wave))
        return json_response(status, doc)

    spec = orjson.dumps(openapi_document())

    async def openapi(_: web.Request) -> web.Response:
        return web.Response(body=spec, content_type="application/json")

    app.router.add_get(LIFECYCLE, get_lifecycle)
    app.router.add_post(LIFECYCLE + "/drain", drain)
    app.router.add_post(LIFECYCLE + "/readmit", readmit)
    app.router.add_get("/narwhal/openapi.json", openapi)


# The answers that are not the lifecycle document: the control token's 401/403 (``auth.py``) and the
# client listener's 404 for ``/narwhal/*`` when a control listener is configured (``listeners.py``).
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "an answer before the lifecycle: what was wrong, and a stable code",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string", "enum": ["authentication_error", "not_found"]},
                "code": {
                    "type": "string",
                    "enum": ["missing_token", "invalid_token", "control_listener_only"],
                },
            },
            "required": ["message", "type", "code"],
            "additionalProperties": False,
        }
    },
    "required": ["error"],
    "additionalProperties": False,
}
_GATES = {
    "401": "control token missing (Authorization: Bearer <token>; reads only with control.protect_reads)",
    "403": "control token wrong",
    "404": "on the client listener when a control listener (control.port) is configured",
}


def _responses(codes: dict[str, str]) -> dict[str, Any]:
    def schema(code: str) -> dict[str, str]:
        name = "ErrorResponse" if code in _GATES else "LifecycleDocument"
        return {"$ref": f"#/components/schemas/{name}"}

    codes = {**codes, **_GATES}
    return {
        c: {"description": d, "content": {"application/json": {"schema": schema(c)}}}
        for c, d in codes.items()
    }


def openapi_document() -> dict[str, Any]:
    """OpenAPI 3.1 for the lifecycle endpoints, generated from the pydantic models."""
    doc_schema = document_schema()
    defs = doc_schema.pop("$defs", {})
    doc_schema.pop("$schema", None)
    doc_schema.pop("$id", None)
    schemas: dict[str, Any] = {"LifecycleDocument": doc_schema, "ErrorResponse": ERROR_SCHEMA, **defs}
    for model in (DrainRequest, ReadmitRequest):
        schemas[model.__name__] = model.model_json_schema(ref_template="#/components/schemas/{model}")
    text = orjson.dumps(schemas).replace(b"#/$defs/", b"#/components/schemas/")
    common = {"422": "body not valid by this schema, or not JSON (error names the field)"}

    def post(model: str, summary: str, codes: dict[str, str]) -> dict[str, Any]:
        return {
            "post": {
                "summary": summary,
                "requestBody": {
                    "required": False,
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model}"}}},
                },
                "responses": _responses({**codes, **common}),
            }
        }

    return {
        "openapi": "3.1.0",
        "info": {"title": "Narwhal lifecycle API", "version": "1"},
        "paths": {
            LIFECYCLE: {
                "get": {"summary": "Lifecycle document", "responses": _responses({"200": "document"})}
            },
            LIFECYCLE + "/drain": post(
                "DrainRequest",
                "Drain one engine, or the whole fleet as a wave",
                {
                    "200": "drain started",
                    "409": "unsafe request shape",
                    "503": "not controlling the fleet, or identity capture failed (repeat to retry)",
                },
            ),
            LIFECYCLE + "/readmit": post(
                "ReadmitRequest",
                "Validate restarted engines and return them to placement",
                {
                    "200": "readmitted",
                    "409": "invalid shape or validation failed (engines stay blocked)",
                    "503": "not controlling the fleet, or control lost during validation",
                },
            ),
        },
        "components": {"schemas": orjson.loads(text)},
    }
