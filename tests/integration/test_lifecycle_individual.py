"""Lifecycle API against real processes: router + supervised simulated engines (individual policy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.fleet import process_start, reset_faults, set_fault
from tests.support.lifecycle import client_load, start_stack, wait_for
from tests.support.procs import proc_group

pytestmark = pytest.mark.integration


def test_individual_restart_under_load_loses_no_request(tmp_path: Path) -> None:
    with proc_group(tmp_path) as group:
        s = start_stack(group, tmp_path, itl_ms=10)
        with client_load(s.router.url) as load:
            wait_for("client traffic", lambda: load.ok >= 8)
            status, doc = s.post("drain", {"engines": ["e0"], "deadline_s": 30})
            assert status == 200 and doc["error"] == ""
            e0 = doc["engines"]["e0"]
            assert e0["accepts_new"] is False and e0["draining"] is True
            assert e0["old_process_start"] == pytest.approx(process_start(s.url("e0")))

            def safe() -> dict[str, Any] | None:
                view = s.lifecycle()["engines"]["e0"]
                return view if view["ready_to_stop"] else None

            view = wait_for("e0 ready_to_stop", safe)
            assert view["resident"] == {"prefill": 0, "decode": 0} and view["state"] == "drained"
            # readmitting the same process is refused: it did not restart
            status, doc = s.post("readmit", {"engines": ["e0"]})
            assert status == 409 and doc["error"] == "readmission validation failed"
            assert doc["engines"]["e0"]["error"] == "engine process did not restart after drain"
            assert doc["engines"]["e0"]["state"] == "blocked" and not doc["engines"]["e0"]["accepts_new"]
            restarted = s.restart("e0")
            assert restarted["new_process_start"] > e0["old_process_start"]
            status, doc = s.post("readmit", {"engines": ["e0"]})
            assert status == 200, doc
            e0 = doc["engines"]["e0"]
            assert e0["state"] == "active" and e0["accepts_new"] and e0["error"] == ""
            assert e0["new_process_start"] == pytest.approx(restarted["new_process_start"])
            assert doc["process_starts"]["e0"] == pytest.approx(restarted["new_process_start"])
            assert e0["checks"][0] == "health" and e0["checks"][1].startswith("attestation ")
            assert e0["checks"][2:5] == ["model", "new process identity", "generation"]
            assert any(c.startswith("fabric produce to ") for c in e0["checks"])
            assert any(c.startswith("fabric consume from ") for c in e0["checks"])
            assert e0["checks"][-1] == "final health"
            served_before = load.ok
            wait_for("traffic after readmission", lambda: load.ok >= served_before + 8)
        assert load.failed == [], load.failed[:5]
        actions = [e["action"] for e in s.lifecycle()["events"]]
        assert (
            actions[:3] == ["drain_started", "process_recorded", "drain_complete"]
            or "drain_complete" in actions
        )
        assert actions[-1] == "readmitted"
        wait_for(
            "readmitted journaled",
            lambda: (
                [r["action"] for r in s.router.journal_rows() if r.get("event") == "engine_lifecycle"][-1:]
                == ["readmitted"]
            ),
        )
        metrics = s.router.metrics()
        assert metrics['narwhal_engine_lifecycle_state{iid="e0",state="active"}'] == 1
        assert metrics['narwhal_engine_draining{iid="e0"}'] == 0


BAD_REPLACEMENTS: list[tuple[dict[str, Any], str]] = [
    ({"wrong_model": "other-model"}, "serves ['other-model'], expected sim-model"),
    ({"attestation": "broken"}, "attestation: "),
    ({"kv_layout": "nixl-v9"}, "fabric "),
    ({"generation_fail": True}, "generation failed"),
]


def test_bad_replacements_stay_blocked(tmp_path: Path) -> None:
    """Wrong model, broken attestation, incompatible KV layout, failing generation: 409, still held."""
    with proc_group(tmp_path) as group:
        s = start_stack(group, tmp_path)
        for fault, expect in BAD_REPLACEMENTS:
            assert s.post("drain", {"engines": ["e1"], "deadline_s": 30})[0] == 200
            wait_for("e1 ready_to_stop", lambda: s.lifecycle()["engines"]["e1"]["ready_to_stop"])
            s.restart("e1")
            set_fault(s.url("e1"), **fault)
            status, doc = s.post("readmit", {"engines": ["e1"]})
            e1 = doc["engines"]["e1"]
            assert status == 409 and doc["error"] == "readmission validation failed", fault
            assert e1["state"] == "blocked" and e1["draining"] and not e1["accepts_new"]
            assert expect in e1["error"], (fault, e1)
            assert s.router.get("/ready").status_code == 200  # the rest of the fleet keeps serving
            reset_faults(s.url("e1"))
            status, doc = s.post("readmit", {"engines": ["e1"]})
            assert status == 200 and doc["engines"]["e1"]["state"] == "active", doc["engines"]["e1"]


def test_deadline_exceeded_keeps_work_then_drains(tmp_path: Path) -> None:
    """Work resident past the drain deadline is kept (never cancelled) and the engine drains when it
    ends. A long stream of the test's own holds the engine past the deadline, whatever the load's
    requests do (a load request could otherwise end before the first look after the deadline)."""
    with proc_group(tmp_path) as group:
        s = start_stack(group, tmp_path, itl_ms=60)
        body = {"model": "sim-model", "prompt": "hold", "max_tokens": 2000, "stream": True}
        with httpx.stream("POST", s.router.url + "/v1/completions", json=body, timeout=60) as held:
            assert held.status_code == 200
            lines = held.iter_lines()  # kept: a dropped iterator closes the stream
            first = next(lines)
            assert first.startswith("data: {") and "error" not in first, first  # resident on an engine now

            def busy() -> str | None:
                engines = s.lifecycle()["engines"]
                return next((i for i, v in engines.items() if v["resident"]["decode"] > 0), None)

            iid = wait_for("the engine holding the stream", busy)
            with client_load(s.router.url, workers=6, max_tokens=30) as load:
                status, doc = s.post("drain", {"engines": [iid], "deadline_s": 0.05})
                assert status == 200, doc

                def exceeded() -> dict[str, Any] | None:
                    view = s.lifecycle()["engines"][iid]
                    return view if view["state"] == "deadline_exceeded" else None

                view = wait_for("deadline_exceeded", exceeded)
                assert view["error"].endswith("resident request(s) remain after the drain deadline")
                assert not view["ready_to_stop"] and not view["accepts_new"]
                held.close()  # the held stream ends; the load's requests on the engine finish
                view = wait_for(
                    "drained", lambda: (v := s.lifecycle()["engines"][iid])["state"] == "drained" and v
                )
                assert view["ready_to_stop"] and view["error"].endswith("after the drain deadline")
            assert load.failed == [], load.failed[:5]  # the deadline never cancels work
            assert load.ok > 0


def test_identity_capture_failure_then_retry(tmp_path: Path) -> None:
    with proc_group(tmp_path) as group:
        s = start_stack(group, tmp_path, extra={"recovery": {"liveness_every": 1000}})
        s.supervise("e2", "stop")
        status, doc = s.post("drain", {"engines": ["e2"], "deadline_s": 30})
        assert status == 503 and doc["error"].startswith("e2: process identity unreadable: "), doc["error"]
        e2 = doc["engines"]["e2"]
        assert e2["state"] == "blocked" and e2["draining"] and e2["old_process_start"] is None
        s.supervise("e2", "start")
        status, doc = s.post("drain", {"engines": ["e2"], "deadline_s": 30})
        assert status == 200 and doc["engines"]["e2"]["old_process_start"] == pytest.approx(
            process_start(s.url("e2"))
        )
        assert doc["engines"]["e2"]["state"] == "drained"


def test_unplanned_restart_is_validated_and_readmitted(tmp_path: Path) -> None:
    with proc_group(tmp_path) as group:
        s = start_stack(group, tmp_path)
        before = s.lifecycle()["process_starts"]["e2"]
        restarted = s.restart("e2")

        def recovered() -> dict[str, Any] | None:
            doc = s.lifecycle()
            e2 = doc["engines"]["e2"]
            return doc if e2["state"] == "active" and e2["new_process_start"] else None

        doc = wait_for("automatic recovery of e2", recovered, timeout=20)
        e2 = doc["engines"]["e2"]
        assert e2["restart_required"] is False and "process identity" in e2["checks"]
        assert e2["accepts_new"] and doc["process_starts"]["e2"] == pytest.approx(
            restarted["new_process_start"]
        )
        assert doc["process_starts"]["e2"] != before
        actions = [e["action"] for e in doc["events"]]
        assert actions[-2:] == ["recovery_validation_started", "readmitted"]
        ejected = wait_for(
            "e2's ejection journaled",
            lambda: [
                r for r in s.router.journal_rows() if r.get("event") == "engine_ejected" and r["iid"] == "e2"
            ],
        )
        assert ejected and ejected[0]["cause"] in ("liveness", "process_identity")
