"""Failure quarantine and role floors through a real router over simulated engines."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import loopback
from tests.support.fleet import set_fault, start_sims, write_fleet
from tests.support.lifecycle import FAST, wait_for
from tests.support.procs import proc_group
from tests.support.router import start_router

pytestmark = pytest.mark.integration


def test_a_failing_engine_is_quarantined_and_a_drain_below_the_floor_is_refused(tmp_path: Path) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3, roles=["prefill", "decode", "decode"])
        extra = {**FAST, "recovery": {**FAST["recovery"], "failure_quarantine_s": 120.0},
                 "controller": {**FAST["controller"], "min_decode": 2}}  # fmt: skip
        router = start_router(group, write_fleet(tmp_path, sims, extra=extra), tmp_path, wait_ready=True)
        set_fault(sims[2].url, error_rate=1.0)  # e2 answers every leg with an error

        def quarantined() -> dict[str, object] | None:
            r = loopback.post(
                router.url + "/v1/completions", json={"model": "sim-model", "prompt": "x", "max_tokens": 2}
            )
            assert r.status_code == 200  # retried elsewhere: the client never sees e2's failure
            q = router.get("/narwhal/state").json()["scheduler"]["engines"]["e2"]["quarantine"]
            return q if q else None

        q = wait_for("e2 quarantined after a leg failure", quarantined)
        assert 0 < q["remaining_s"] <= 120.0  # type: ignore[operator]
        assert router.get("/narwhal/lifecycle").json()["engines"]["e2"]["accepts_new"] is False
        events = wait_for(
            "the quarantine journaled",
            lambda: [r for r in router.journal_rows() if r.get("event") == "engine_quarantined"],
        )
        assert events and events[0]["iid"] == "e2" and events[0]["duration_s"] == 120.0

        # e2 is out: draining e1 would leave only e0 able to serve decode, below min_decode = 2
        r = router.post("/narwhal/lifecycle/drain", {"engines": ["e1"]})
        assert r.status_code == 409
        assert r.json()["error"] == (
            "draining e1 would leave 1 engine(s) able to serve the decode role, below controller.min_decode = 2"
        )
        assert r.json()["engines"]["e1"]["state"] == "active"
