"""Whole-wave lifecycle against real processes (``engine_restart_policy: whole_wave``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.fleet import reset_faults, set_fault
from tests.support.lifecycle import Stack, start_stack, wait_for
from tests.support.procs import proc_group

pytestmark = pytest.mark.integration
IIDS = ["e0", "e1", "e2"]


def ready(s: Stack) -> tuple[int, str]:
    r = s.router.get("/ready")
    return r.status_code, r.json().get("reason", "")


def drain_wave_until_safe(s: Stack) -> dict[str, Any]:
    status, doc = s.post("drain", {"wave": True, "deadline_s": 30})
    assert status == 200, doc
    assert doc["wave"]["active"] and doc["wave"]["id"].startswith("wave-")
    assert ready(s) == (503, f"whole-wave drain {doc['wave']['id']}") or ready(s)[1].startswith("whole-wave")
    doc = wait_for("wave.ready_to_stop", lambda: (d := s.lifecycle())["wave"]["ready_to_stop"] and d)
    assert all(doc["engines"][i]["ready_to_stop"] and doc["engines"][i]["old_process_start"] for i in IIDS)
    return doc


def test_whole_wave_restart_cycle(tmp_path: Path) -> None:
    with proc_group(tmp_path) as group:
        s = start_stack(group, tmp_path, policy="whole_wave")
        status, doc = s.post("drain", {"engines": ["e0"], "deadline_s": 30})
        assert status == 409 and doc["error"] == "engine_restart_policy requires a whole-wave drain"
        assert not any(v["draining"] for v in doc["engines"].values())

        doc = drain_wave_until_safe(s)
        wave = doc["wave"]["id"]
        assert ready(s)[0] == 503
        status, doc = s.post("readmit", {"engines": ["e0"]})
        assert (
            status == 409
            and doc["error"] == "an active whole wave must be validated and readmitted as one engine set"
        )
        for iid in IIDS:
            s.restart(iid)
        # one bad member keeps the whole wave blocked
        set_fault(s.url("e2"), attestation="broken")
        status, doc = s.post("readmit", {"wave": True})
        assert status == 409 and doc["error"] == "readmission validation failed"
        assert all(doc["engines"][i]["state"] == "blocked" for i in IIDS)
        assert doc["engines"]["e2"]["error"].startswith("attestation: ")
        assert doc["engines"]["e0"]["error"] == "another engine in the wave failed validation"
        assert doc["wave"]["id"] == wave and ready(s)[0] == 503
        reset_faults(s.url("e2"))
        status, doc = s.post("readmit", {"wave": True})
        assert status == 200, {i: doc["engines"][i]["error"] for i in IIDS}
        assert doc["wave"] == {"id": "", "active": False, "ready_to_stop": False}
        assert all(doc["engines"][i]["state"] == "active" and doc["engines"][i]["accepts_new"] for i in IIDS)
        assert wait_for("/ready 200", lambda: ready(s)[0] == 200)
        r = s.router.post("/v1/completions", {"model": "sim-model", "prompt": "after", "max_tokens": 4})
        assert r.status_code == 200


def test_unplanned_restart_holds_the_whole_fleet(tmp_path: Path) -> None:
    with proc_group(tmp_path) as group:
        s = start_stack(group, tmp_path, policy="whole_wave")
        s.restart("e1")
        doc = wait_for("whole-wave restart hold", lambda: (d := s.lifecycle())["wave"]["active"] and d)
        _code, reason = wait_for("/ready 503", lambda: (r := ready(s))[0] == 503 and r)
        assert reason == "whole-wave restart required: engine e1 was excluded"
        assert all(
            doc["engines"][i]["state"] == "blocked" and not doc["engines"][i]["accepts_new"] for i in IIDS
        )
        assert all(doc["engines"][i]["old_process_start"] is None for i in IIDS)
        status, doc = s.post("readmit", {"wave": True})
        assert (
            status == 409 and doc["error"] == "whole-wave recovery requires recorded pre-restart identities"
        )
        drain_wave_until_safe(s)  # captures identities under the existing hold
        for iid in IIDS:
            s.restart(iid)
        status, doc = s.post("readmit", {"wave": True})
        assert status == 200, {i: doc["engines"][i]["error"] for i in IIDS}
        assert wait_for("/ready 200", lambda: ready(s)[0] == 200)
