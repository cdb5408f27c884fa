"""``GET /narwhal/state`` (narwhal.state v1) and ``GET /narwhal/targets`` (Prometheus HTTP SD).

In-process router on an injected clock; engines point at a closed loopback port. The shapes are
pinned: the state schema file is generated from the model, targets entries have exactly the
documented keys.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from aiohttp.test_utils import TestClient, TestServer

from router.assemble import ROUTER_KEY, RouterOptions, build_router
from router.clock import FakeClock
from router.config import parse_fleet
from router.core import RouterCore
from router.counters import HANDOFF_COUNTERS
from router.state import SCHEMA_PATH, schema_text
from router.targets import TARGETS, build_targets

SCHEMA = json.loads(SCHEMA_PATH.read_text())


def fleet(**extra: Any) -> Any:
    return parse_fleet(
        {
            "model": "m",
            "engines": [
                {"iid": "e1", "url": "http://127.0.0.1:1", "role": "decode"},
                {"iid": "e0", "url": "http://127.0.0.1:2/", "role": "prefill"},
                {"iid": "e2", "url": "https://[::1]/vllm", "role": "decode", "pin": True},
            ],
            **extra,
        }
    )


def test_state_schema_file_is_generated_from_the_model() -> None:
    assert SCHEMA_PATH.read_text() == schema_text(), "regenerate: python -m router.state"


def test_targets_shape_one_entry_per_engine() -> None:
    core = RouterCore(config=fleet(), journal=_journal())
    entries = json.loads(TARGETS.dump_json(build_targets(core.scheduler.engines.values()), by_alias=True))
    assert entries == [
        {
            "targets": ["127.0.0.1:2"],
            "labels": {"iid": "e0", "role": "prefill", "__scheme__": "http", "__metrics_path__": "/metrics",
                       "__meta_narwhal_url": "http://127.0.0.1:2"},
        },
        {
            "targets": ["127.0.0.1:1"],
            "labels": {"iid": "e1", "role": "decode", "__scheme__": "http", "__metrics_path__": "/metrics",
                       "__meta_narwhal_url": "http://127.0.0.1:1"},
        },
        {
            "targets": ["[::1]:443"],
            "labels": {"iid": "e2", "role": "decode", "__scheme__": "https",
                       "__metrics_path__": "/vllm/metrics", "__meta_narwhal_url": "https://[::1]/vllm"},
        },
    ]  # fmt: skip


def _journal() -> Any:
    from router.journal import Journal

    return Journal(None)


@pytest.fixture
async def router(tmp_path: Path) -> AsyncIterator[tuple[TestClient[Any, Any], RouterCore, FakeClock]]:
    clock = FakeClock()
    cfg = fleet(recovery={"failure_quarantine_s": 5.0})
    app, core = build_router(cfg, RouterOptions(journal=str(tmp_path / "j.jsonl")), clock=clock)
    async with TestClient(TestServer(app)) as client:
        yield client, core, clock


async def test_targets_route_and_state_document(
    router: tuple[TestClient[Any, Any], RouterCore, FakeClock],
) -> None:
    client, core, _ = router
    resp = await client.get("/narwhal/targets")
    assert resp.status == 200 and resp.content_type == "application/json"
    body = await resp.json()
    assert [t["labels"]["iid"] for t in body] == ["e0", "e1", "e2"]
    assert all(set(t) == {"targets", "labels"} for t in body)

    resp = await client.get("/narwhal/state")
    assert resp.status == 200
    doc = await resp.json()
    jsonschema.validate(doc, SCHEMA)
    assert (doc["schema"], doc["schema_version"], doc["model"]) == ("narwhal.state", 1, "m")
    assert list(doc["counters"]) == list(HANDOFF_COUNTERS)
    assert doc["run"] == core.journal.run_id
    assert doc["scheduler"]["floors"] == {"prefill": 1, "decode": 1}
    assert doc["ha"] == {"epoch": 0, "holder": "", "lease": False, "controls_fleet": True,
                         "standby": False, "fenced": False, "blocked": ""}  # fmt: skip
    assert doc["lifecycle"]["schema"] == "narwhal.lifecycle"
    assert set(doc["lifecycle"]["engines"]) == {"e0", "e1", "e2"}
    assert doc["monitoring"]["degraded"] == ""
    e1 = doc["scheduler"]["engines"]["e1"]
    assert e1["quarantine"] is None and e1["accepts_new"] is True


async def test_quarantine_after_a_leg_failure_is_timed_and_visible(
    router: tuple[TestClient[Any, Any], RouterCore, FakeClock],
) -> None:
    client, _, clock = router
    breaker = client.app[ROUTER_KEY].parts.breaker
    breaker.record_failure("e1", "timeout")
    doc = await (await client.get("/narwhal/state")).json()
    e1 = doc["scheduler"]["engines"]["e1"]
    assert e1["accepts_new"] is False
    assert e1["quarantine"] == {"until": clock.wall() + 5.0, "remaining_s": 5.0, "cause": "timeout"}
    assert "e1" not in doc["scheduler"]["eligible"]
    assert doc["breaker"]["quarantines"] == {"e1": 1}
    lifecycle = await (await client.get("/narwhal/lifecycle")).json()
    assert lifecycle["engines"]["e1"]["accepts_new"] is False  # lifecycle view: not placement-eligible

    clock.advance(4.0)
    breaker.record_failure("e1", "overload")  # a later failure extends the hold
    clock.advance(4.0)
    e1 = (await (await client.get("/narwhal/state")).json())["scheduler"]["engines"]["e1"]
    assert e1["quarantine"]["cause"] == "overload" and e1["quarantine"]["remaining_s"] == 1.0
    clock.advance(1.0)
    doc = await (await client.get("/narwhal/state")).json()
    assert doc["scheduler"]["engines"]["e1"]["quarantine"] is None
    assert doc["scheduler"]["engines"]["e1"]["accepts_new"] is True
    assert doc["breaker"]["quarantines"] == {"e1": 1}  # extended, not a second quarantine


async def test_quarantine_spares_the_engine_a_role_floor_needs(
    router: tuple[TestClient[Any, Any], RouterCore, FakeClock],
) -> None:
    client, core, _ = router
    breaker = client.app[ROUTER_KEY].parts.breaker
    breaker.record_failure("e0", "timeout")  # e0 out: e1 (unpinned) still serves prefill
    assert "e0" in core.scheduler.quarantined
    breaker.record_failure("e1", "timeout")  # e1 is now the last engine able to serve prefill
    assert "e1" not in core.scheduler.quarantined and core.scheduler.accepts_new("e1")
    assert [e.iid for e in core.scheduler.eligible()] == ["e1", "e2"]  # placement still possible


async def test_drain_below_a_role_floor_answers_409_naming_the_role(tmp_path: Path) -> None:
    app, core = build_router(
        fleet(controller={"min_decode": 3}), RouterOptions(journal=str(tmp_path / "j.jsonl"))
    )
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/narwhal/lifecycle/drain", json={"engines": ["e2"]})
        assert resp.status == 409
        doc = await resp.json()
        assert doc["error"] == (
            "draining e2 would leave 2 engine(s) able to serve the decode role, below controller.min_decode = 3"
        )
        assert doc["engines"]["e2"]["state"] == "active" and not core.scheduler.draining
