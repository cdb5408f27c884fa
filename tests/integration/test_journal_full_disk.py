"""The journal on a real full filesystem (a 64 KiB tmpfs, filled): requests are still served, the
failure is counted in ``/metrics`` and named in ``/ready`` (still 200), logged once, and after the
space is freed the rows are written again. The tmpfs is unmounted by its fixture even on failure.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.serving_support import contract_free_fleet
from tests.support.fleet import start_sims
from tests.support.procs import proc_group
from tests.support.router import RouterHandle, start_router
from tests.support.smallfs import SmallFs, small_tmpfs
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[SmallFs]:
    with small_tmpfs(tmp_path / "journalfs") as mounted:
        yield mounted


def _complete(router: RouterHandle, prompt: str) -> int:
    body = {"model": "sim-model", "prompt": prompt, "max_tokens": 4}
    return router.post("/v1/completions", body).status_code


def _rows(router: RouterHandle) -> list[dict[str, Any]]:
    """The complete rows on disk; a last line the full disk cut short is completed later."""
    text = router.journal.read_bytes().decode() if router.journal.exists() else ""
    return [json.loads(line) for line in text.split("\n")[:-1]]


def _served_rows(router: RouterHandle) -> int:
    return sum(1 for r in _rows(router) if r.get("terminal") == "completed")


def _all_served_written(router: RouterHandle) -> bool:
    return _served_rows(router) == router.metrics()["narwhal_served_total"]


def test_a_full_journal_disk_is_counted_and_reported_serving_goes_on_and_rows_resume(
    tmp_path: Path, fs: SmallFs
) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 2, roles=["prefill", "decode"], itl_ms=2)
        fleet = contract_free_fleet(tmp_path, sims)
        router = start_router(group, fleet, fs.path, wait_ready=True)  # the journal on the tmpfs
        assert _complete(router, "before") == 200
        wait_for("the first row written", lambda: len(_rows(router)) >= 2)
        assert "journal_degraded" not in router.get("/ready").json()
        fs.fill()
        try:
            wait_for(  # each request's row is a write the full disk refuses
                "journal writes failing",
                lambda: (
                    _complete(router, "on a full disk") == 200
                    and router.metrics().get("narwhal_journal_write_errors_total", 0) >= 2
                ),
                timeout=60,
            )
            ready = router.get("/ready")
            assert ready.status_code == 200  # journal loss does not withdraw readiness
            assert ready.json()["journal_degraded"].startswith(
                "journal write failing: No space left on device"
            )
            assert router.metrics()["narwhal_journal_degraded"] == 1
            assert _complete(router, "still serving") == 200
            assert router.proc.output().count("journal write failed: No space left on device") == 1
        finally:
            fs.free()
        # every row kept during the fault is written: one served row per served request
        wait_for("journal rows written again", lambda: _all_served_written(router), timeout=30)
        assert "journal_degraded" not in router.get("/ready").json()
        assert _complete(router, "after") == 200
        wait_for("the next row written", lambda: _all_served_written(router), timeout=30)
        assert _served_rows(router) >= 4  # before, on a full disk (at least twice), still serving, after
        m = router.metrics()
        assert m["narwhal_journal_degraded"] == 0 and m["narwhal_journal_dropped_rows_total"] == 0
        wait_for("the recovery logged", lambda: "journal writes recovered after" in router.proc.output())
        assert router.proc.alive()
