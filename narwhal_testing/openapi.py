"""The router's control OpenAPI document (``/narwhal/openapi.json``) as a test oracle: validate an
answer against the schema the document gives for its path, method and status, and the request
bodies the document calls valid (edge cases picked from its own request schemas).

Needs ``jsonschema`` (the dev extras); nothing outside the tests imports this module.
"""

from __future__ import annotations

import math
from typing import Any

import jsonschema


def _rooted(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with the document's components beside it, so ``#/components/…`` refs resolve."""
    return {**schema, "components": doc["components"]}


def request_schema(doc: dict[str, Any], path: str, method: str = "post") -> dict[str, Any]:
    body = doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    return _rooted(doc, body)


def response_schema(doc: dict[str, Any], path: str, method: str, status: int) -> dict[str, Any]:
    """The schema documented for ``status``; AssertionError when the status is not documented."""
    responses = doc["paths"][path][method.lower()]["responses"]
    assert str(status) in responses, f"{method} {path} answered {status}, documented: {sorted(responses)}"
    return _rooted(doc, responses[str(status)]["content"]["application/json"]["schema"])


def check_response(doc: dict[str, Any], path: str, method: str, status: int, body: Any) -> None:
    """The answer is documented: its status is listed and its body is valid by that schema."""
    schema = response_schema(doc, path, method, status)
    jsonschema.Draft202012Validator(schema).validate(body)


def is_valid_request(doc: dict[str, Any], path: str, body: Any) -> bool:
    return bool(jsonschema.Draft202012Validator(request_schema(doc, path)).is_valid(body))


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        schema = doc["components"]["schemas"][name]
    return schema


def _values(prop: dict[str, Any], engines: list[str]) -> list[Any]:
    """Edge values of one property, valid by its schema."""
    kind = prop.get("type")
    if kind == "boolean":
        return [True, False]
    if kind == "number":
        lo, hi = prop.get("minimum", -math.inf), prop.get("maximum", math.inf)
        picks = [prop.get("default", 1.0), 0, -0.0, 1, 0.001, 5e-324, 2**64, -(2**63) - 1, 1e308]
        return [v for v in picks if lo <= v <= hi] + [v for v in (lo, hi) if math.isfinite(v)]
    if kind == "array" and prop.get("items", {}).get("type") == "string":
        picks = [[], engines[:1], list(engines), ["\u0000"], ["é" * 200], ["", "x"]]
        return [p for p in picks if not prop.get("uniqueItems") or len(set(p)) == len(p)]
    raise AssertionError(f"no edge values for a schema of type {kind!r}: {prop}")


def edge_bodies(doc: dict[str, Any], path: str, engines: list[str]) -> list[dict[str, Any]]:
    """Bodies valid by the request schema of ``path``: empty, each property at each of its edge
    values, and every property at once."""
    schema = _resolve(doc, doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"])
    props: dict[str, dict[str, Any]] = schema["properties"]
    out: list[dict[str, Any]] = [{}]
    for name, prop in props.items():
        out += [{name: v} for v in _values(prop, engines)]
    out.append({name: _values(prop, engines)[1] for name, prop in props.items()})
    for body in out:
        assert is_valid_request(doc, path, body), body  # the oracle's own check
    return out
