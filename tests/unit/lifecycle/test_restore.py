"""Strict restore (spec §2.4 step 6) and the peer's handoff fixtures."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest

from router.lifecycle.machine import LifecycleError

from .helpers import EXAMPLES, machine


def base_section() -> dict[str, Any]:
    m, _, _ = machine()
    m.process_starts = {"e0": 1.0, "e1": 2.0, "e2": 3.0}
    m.begin(["e0"], False, 300)
    m.record_old_identity("e0", 1.0)
    return m.snapshot().model_dump()


def mutate(path: str, value: Any) -> dict[str, Any]:
    sec = copy.deepcopy(base_section())
    target: Any = sec
    parts = path.split(".")
    for p in parts[:-1]:
        target = target[int(p)] if p.isdigit() else target[p]
    last = parts[-1]
    if value is KeyError:
        del target[last]
    else:
        target[last] = value
    return sec


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("records.0.iid", "zz"),
        ("records.0.state", "paused"),
        ("records.0.extra", 1),
        ("records.0.requested_at", True),
        ("records.0.requested_at", "1"),
        ("records.0.deadline_at", math.inf),
        ("records.0.old_process_start", math.nan),
        ("records.0.restart_required", "yes"),
        ("records.0.checks", "health"),
        ("records.0.checks", [1]),
        ("records.0.wave_id", "wave-000000000001"),  # orphan wave id
        ("wave_id", "wave-000000000001"),  # wave without its members
        ("engine_restart_policy", "whole_wave"),
        ("process_starts", {"zz": 1.0}),
        ("process_starts", {"e0": 0}),
        ("process_starts", {"e0": True}),
        ("records", "nope"),
    ],
)
def test_restore_rejects_malformed_without_touching_holds(path: str, value: Any) -> None:
    m, sched, _ = machine()
    m.begin(["e1"], False, 300)
    before = (copy.deepcopy(m.records), set(sched.draining), list(m.events))
    with pytest.raises(LifecycleError):
        m.restore(mutate(path, value))
    assert (m.records, sched.draining, list(m.events)) == before


def test_restore_rejects_non_object_and_duplicates() -> None:
    m, _, _ = machine()
    with pytest.raises(LifecycleError):
        m.restore([])  # type: ignore[arg-type]
    sec = base_section()
    sec["records"].append(copy.deepcopy(sec["records"][0]))
    with pytest.raises(LifecycleError, match="duplicate"):
        m.restore(sec)


def test_restore_keeps_last_200_events_and_null_events() -> None:
    m, _, _ = machine()
    sec = base_section()
    sec["events"] = [{"event": "engine_lifecycle", "action": "x", "at": float(i)} for i in range(250)]
    m.restore(sec)
    assert len(m.events) == 200 and m.events[0]["at"] == 50.0
    sec["events"] = None
    m.restore(sec)
    assert list(m.events) == []


def test_restore_peer_handoff_fixtures() -> None:
    for name in ("handoff_initial.json", "handoff_after_resume.json"):
        doc = json.loads((EXAMPLES / name).read_text())
        m, sched, _ = machine()
        m.restore(doc["lifecycle"])
        held = {r["iid"] for r in doc["lifecycle"]["records"] if r["state"] != "active"}
        assert sched.draining == held
        assert m.snapshot().model_dump()["records"] == doc["lifecycle"]["records"]
