"""The lifecycle document: same shape as the peer's captured documents; pinned JSON schema."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from router.core import RouterCore
from router.journal import Journal
from router.lifecycle.document import (
    SCHEMA_PATH,
    DrainRequest,
    ReadmitRequest,
    RequestError,
    build_document,
    parse_request,
    schema_text,
)
from router.lifecycle.machine import LifecycleMachine

from .helpers import EXAMPLES, fleet

LIFECYCLE_EXAMPLES = [
    *sorted(
        p
        for p in EXAMPLES.glob("*.json")
        if json.loads(p.read_text()).get("body", {}).get("schema") == "narwhal.lifecycle"
    ),
    EXAMPLES / "lifecycle_initial.json",
    EXAMPLES / "wave_unplanned_hold.json",
]


def shape(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: shape(x) for k, x in v.items()}
    if isinstance(v, list):
        return [shape(v[0])] if v and not isinstance(v[0], dict) else "list"
    if isinstance(v, bool) or v is None:
        return type(v).__name__
    if isinstance(v, int | float):
        return "number"
    return type(v).__name__


def test_schema_file_is_generated_from_the_model() -> None:
    assert SCHEMA_PATH.read_text() == schema_text(), "regenerate: python -m router.lifecycle.document"


@pytest.mark.parametrize("path", LIFECYCLE_EXAMPLES, ids=lambda p: p.name)
def test_peer_examples_validate_against_schema(path: Any) -> None:
    doc = json.loads(path.read_text())
    jsonschema.validate(doc.get("body", doc), json.loads(SCHEMA_PATH.read_text()))


def core_and_machine() -> tuple[RouterCore, LifecycleMachine]:
    core = RouterCore(config=fleet(), journal=Journal(None))
    machine = LifecycleMachine(core.config, core.scheduler, core.clock, on_event=core.journal.append)
    return core, machine


def test_document_matches_peer_drain_shape() -> None:
    core, m = core_and_machine()
    m.process_starts = {"e0": 1.5, "e1": 2.5, "e2": 3.5}
    m.begin(["e0"], False, 300)
    m.record_old_identity("e0", 1.5)
    ours = build_document(m, core).to_json()
    peer = json.loads((EXAMPLES / "drain_e0.json").read_text())["body"]
    assert shape(ours) == shape(peer)
    assert list(ours) == list(peer)
    assert list(ours["engines"]["e0"]) == list(peer["engines"]["e0"])
    for a, b in zip(ours["events"], peer["events"], strict=True):
        assert list(a) == list(b) and a["action"] == b["action"]
    assert ours["engines"]["e0"]["ready_to_stop"] is True and ours["wave"]["ready_to_stop"] is True
    jsonschema.validate(ours, json.loads(SCHEMA_PATH.read_text()))
    # every event is journaled too
    journaled = [r["action"] for r in core.journal.recent if r.get("event") == "engine_lifecycle"]
    assert journaled == ["drain_started", "process_recorded", "drain_complete"]


def test_initial_document_equals_peer_initial_shape() -> None:
    core, m = core_and_machine()
    ours = build_document(m, core).to_json()
    peer = json.loads((EXAMPLES / "lifecycle_initial.json").read_text())
    peer["process_starts"] = {}
    assert {k: v for k, v in ours.items()} == {**peer}


@pytest.mark.parametrize(
    ("model", "body", "fragment"),
    [
        (DrainRequest, [], "request body must be a JSON object"),
        (DrainRequest, {"engines": "e0"}, "engines"),
        (DrainRequest, {"engines": [1]}, "engines.0"),
        (DrainRequest, {"wave": "yes"}, "wave"),
        (DrainRequest, {"wave": 1}, "wave"),
        (DrainRequest, {"deadline_s": True}, "deadline_s"),
        (DrainRequest, {"deadline_s": "5"}, "deadline_s"),
        (DrainRequest, {"deadline_s": float("nan")}, "deadline_s: must be finite"),
        (DrainRequest, {"deadline_s": float("inf")}, "deadline_s: must be finite"),
        (DrainRequest, {"engine": ["e0"]}, "engine: unknown field"),
        (ReadmitRequest, {"deadline_s": 5}, "deadline_s: unknown field"),
        (ReadmitRequest, {"engines": None}, "engines"),
    ],
)
def test_request_models_are_strict(model: Any, body: Any, fragment: str) -> None:
    with pytest.raises(RequestError) as err:
        parse_request(model, body)
    assert fragment in str(err.value)


def test_request_defaults() -> None:
    d = parse_request(DrainRequest, {})
    assert (d.engines, d.wave, d.deadline_s) == ([], False, 300.0)
    assert parse_request(DrainRequest, {"deadline_s": 5}).deadline_s == 5.0
    r = parse_request(ReadmitRequest, {"engines": ["e0"], "wave": False})
    assert r.engines == ["e0"]
