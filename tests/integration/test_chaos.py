"""The chaos drill's short (CI) configuration: kill -9 of the worker, the active router, an engine
and the Temporal dev server during rolling restarts under client load must lose no lifecycle hold,
duplicate no engine restart, and fail no client request that a fault does not explain.

Runs the drill (``fleet/chaos``) in its short configuration as a real process, ``python -m
fleet.chaos --short`` (it owns and stops its own processes by PID; this test stops the drill by PID
too, SIGTERM first so it can clean up) and reads its JSON report.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.support.procs import ProcGroup

pytestmark = pytest.mark.integration

DRILL_BUDGET_S = 240.0  # a hang guard, not a speed assertion


@pytest.mark.timeout(300)
def test_short_chaos_drill(tmp_path: Path) -> None:
    report_path = tmp_path / "chaos.json"
    group = ProcGroup(tmp_path)
    try:
        proc = group.start(
            "chaos",
            [
                sys.executable,
                "-m",
                "fleet.chaos",
                "--short",
                "--seed",
                "3",
                "--json",
                str(report_path),
            ],
        )
        deadline = time.monotonic() + DRILL_BUDGET_S
        while proc.alive() and time.monotonic() < deadline:
            time.sleep(0.5)
        hung = proc.alive()
    finally:
        for p in group.procs:
            p.stop(timeout=60.0)  # SIGTERM first: the drill stops its own processes by PID
    output = proc.log_path.read_text(errors="replace")
    assert not hung, f"drill still running after {DRILL_BUDGET_S}s:\n{output[-4000:]}"
    assert report_path.exists(), f"no report (exit {proc.popen.returncode}):\n{output[-4000:]}"
    report = json.loads(report_path.read_text())
    context = (
        f"{output[-4000:]}\nfailures: {report['failures'][:10]}\nholds: {report['hold_violations'][:10]}"
    )
    assert report["duplicated_restarts"] == 0, context
    assert report["holds_lost"] == 0, context
    assert report["unattributed_failures"] == 0, context
    assert report["lifecycle_samples"] > 0, context
    assert proc.popen.returncode == 0, context
