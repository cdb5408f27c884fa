"""The `narwhal.handoff` v1 document: shape, strict validation (§2.2), the pinned JSON Schema."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from router.counters import HANDOFF_COUNTERS
from router.ha.handoff import SCHEMA_FILE, HandoffError, HandoffVersionError, loads, schema_text, validate
from tests.unit.ha.helpers import core, fixture, handover, machine


@pytest.mark.parametrize("name", ["handoff_initial.json", "handoff_after_resume.json"])
def test_peer_examples_validate_and_round_trip(name: str) -> None:
    raw = fixture(name)
    doc = validate(raw)
    assert doc.dump() == raw  # same keys, same order, same values
    jsonschema.validate(raw, json.loads(SCHEMA_FILE.read_text()))


def test_schema_file_is_generated_from_the_model() -> None:
    assert SCHEMA_FILE.read_text() == schema_text(), (
        "regenerate: python -c 'from router.ha.handoff import ...'"
    )


def test_built_document_has_the_peer_shape() -> None:
    c = core()
    doc = handover(c).build().dump()
    peer = fixture("handoff_initial.json")
    assert list(doc) == list(peer)
    assert list(doc["counters"]) == list(HANDOFF_COUNTERS) == list(peer["counters"])
    assert list(doc["lifecycle"]) == list(peer["lifecycle"])
    assert doc["epoch"] == 0 and doc["holder"] == "" and doc["demand_risk"] is None
    assert doc["engines"] == ["e0", "e1", "e2"] and doc["roles"] == {
        "e0": "prefill",
        "e1": "decode",
        "e2": "decode",
    }
    assert doc["run"] == c.journal.run_id and doc["at"] == c.clock.wall()
    jsonschema.validate(doc, json.loads(SCHEMA_FILE.read_text()))


def test_built_document_carries_drains_suspects_and_risk() -> None:
    c = core()
    m = machine(c)
    assert m.begin(["e1"], wave=False, deadline_s=60)
    m.record_old_identity("e1", 1_700_000_000.0)
    c.scheduler.inference_suspects["e2"] = {"e0", ""}
    c.scheduler.eject("e0", "connection")
    c.counters.finish("served")
    c.counters.finish("rejected", "not_ready")
    c.demand_risk.record("first_token_timeout")
    c.clock.advance(2.5)  # type: ignore[attr-defined]
    doc = handover(c).build()
    assert doc.lifecycle.records[0].state == "drained"
    assert doc.inference_sources == {"e2": ["", "e0"]}
    assert doc.ejected == ["e0"]
    assert doc.counters["served"] == 1 and doc.outcome_reasons["rejected"] == {"not_ready": 1}
    assert doc.demand_risk is not None and doc.demand_risk.age_s == 2.5
    assert doc.demand_risk.events == {"first_token_timeout": 1}


def _mutate(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    parts = path.split(".")
    target: Any = out
    for p in parts[:-1]:
        target = target[int(p)] if isinstance(target, list) else target[p]
    if value is _DELETE:
        del target[parts[-1]]
    else:
        target[parts[-1]] = value
    return out


_DELETE = object()
BAD: list[tuple[str, Any]] = [
    ("epoch", True),
    ("epoch", -1),
    ("epoch", 1.0),
    ("holder", 3),
    ("holder", None),
    ("at", math.nan),
    ("at", "1795966532"),
    ("at", True),
    ("run", 1),
    ("engines", ["e0", "e0", "e1"]),
    ("roles.e0", "both"),
    ("roles.e9", "decode"),
    ("ejected", ["e9"]),
    ("inference_sources", {"e0": ["e9"]}),
    ("inference_sources", {"e0": []}),
    ("inference_sources", {"e9": [""]}),
    ("inference_sources", {"e0": [1]}),
    ("counters.served", -1),
    ("counters.served", True),
    ("counters.served", 1.5),
    ("counters.bogus", 1),
    ("outcome_reasons.failed", {"x": -1}),
    ("outcome_reasons.bogus", {}),
    ("lifecycle", []),
    ("lifecycle.records", {}),
    ("lifecycle.records.0.iid", 5),
    ("lifecycle.records.0.iid", _DELETE),
    ("lifecycle.records.0.state", "sleeping"),
    ("lifecycle.records.0.extra", 1),
    ("lifecycle.records.0.requested_at", True),
    ("lifecycle.records.0.requested_at", "1795966470.9"),
    ("lifecycle.records.0.deadline_at", math.inf),
    ("lifecycle.records.0.old_process_start", math.nan),
    ("lifecycle.records.0.restart_required", 1),
    ("lifecycle.records.0.checks", "health"),
    ("lifecycle.wave_id", 7),
    ("lifecycle.engine_restart_policy", "rolling"),
    ("lifecycle.process_starts.e0", math.nan),
    ("lifecycle.process_starts.e0", 0),
    ("lifecycle.process_starts.e0", True),
    ("lifecycle.process_starts.e9", 1.0),
    ("demand_risk.age_s", -1.0),
    ("demand_risk.age_s", math.inf),
    ("demand_risk.events.p_to_d_recovery", True),
    ("demand_risk.events.p_to_d_recovery", -1),
    ("demand_risk.kind", None),
    ("schema", "narwhal.state"),
    ("extra_top_level", 1),
    ("model", _DELETE),
]


@pytest.mark.parametrize(
    ("path", "value"), BAD, ids=[f"{p}=<deleted>" if v is _DELETE else f"{p}={v!r}" for p, v in BAD]
)
def test_validate_rejects(path: str, value: Any) -> None:
    doc = _mutate(fixture("handoff_after_resume.json"), path, value)
    with pytest.raises(HandoffError):
        validate(doc)


@pytest.mark.parametrize("version", [0, 2, True, "1"])
def test_other_versions_are_refused(version: Any) -> None:
    doc = _mutate(fixture("handoff_initial.json"), "schema_version", version)
    with pytest.raises(HandoffError) as info:
        validate(doc)
    assert isinstance(info.value, HandoffVersionError) == (version in (0, 2) and version is not True)


def test_events_null_is_an_empty_list_and_missing_age_defaults_to_zero() -> None:
    doc = _mutate(fixture("handoff_after_resume.json"), "lifecycle.events", None)
    doc = _mutate(doc, "demand_risk.age_s", _DELETE)
    parsed = validate(doc)
    assert (
        parsed.lifecycle.events == [] and parsed.demand_risk is not None and parsed.demand_risk.age_s == 0.0
    )


def test_loads_rejects_undecodable_bytes() -> None:
    with pytest.raises(HandoffError):
        loads(b"\xff\xfe{")
    with pytest.raises(HandoffError):
        loads('{"schema": "narwhal.handoff", ')
