"""Narwhal 0.7.0's own example fleet file starts a real ``narwhal-serve`` (only its engines and model
swapped for simulated ones): its comment keys are ignored, the peer keys this router does not
implement are named once at start-up as accepted, not used, and requests are served."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import loopback
from tests.support.fleet import start_sims
from tests.support.procs import REPO, proc_group
from tests.support.router import start_router

pytestmark = pytest.mark.integration

PEER_EXAMPLE = REPO / "tests" / "fixtures" / "peer_fleet" / "fleet.example.json"


def test_the_peer_example_fleet_file_starts_and_reports_its_unused_keys(tmp_path: Path) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 2)
        doc = json.loads(PEER_EXAMPLE.read_text(encoding="utf-8"))
        doc["model"] = sims[0].model
        doc["engines"] = [{"iid": s.iid, "url": s.url, "role": s.role} for s in sims]
        doc["recovery"] = {"state_path": str(tmp_path / "state.json")}
        fleet = tmp_path / "fleet.json"
        fleet.write_text(json.dumps(doc), encoding="utf-8")
        router = start_router(group, fleet, tmp_path, wait_ready=True)
        r = loopback.post(
            router.url + "/v1/completions", json={"model": sims[0].model, "prompt": "x", "max_tokens": 2}
        )
        assert r.status_code == 200, r.text
        lines = [line for line in router.proc.output().splitlines() if "accepted, not used: " in line]
        assert len(lines) == 1 and str(fleet) in lines[0], lines
        for key in (
            "hardware (",
            "controller.thresholds (",
            "engine.first_token_calibration_path (",
            "profiles (",
        ):
            assert key in lines[0], lines[0]
        assert "_deployment" not in lines[0] and "_engine" not in lines[0]  # comments, not settings
