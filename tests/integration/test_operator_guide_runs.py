"""docs/operator-guide.md runs as written: every ``bash`` block, in order, against a real stack —
router, local supervisor with simulated engines, the session Temporal dev server and a
``narwhal-worker`` on the CLI's default task queue — with the conventions block's hosts substituted.
A block fails the test when it exits non-zero or does not end within its bound (it hangs).

Skipped, by name: the blocks that need the compose deployment (``docker-compose``) or start a router
of their own for a failover (``narwhal-serve``) — see ``SKIPPED``; a new block runs by default.
"""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.integration.conftest import Temporal, start_worker, wait_ready_line
from tests.support.lifecycle import start_stack
from tests.support.procs import proc_group, script
from tests.support.worker_config import session_worker_config

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "operator-guide.md"
FENCE = re.compile(r"```bash\n(.*?)```", re.S)
SKIPPED = ("docker compose", "docker-compose", "narwhal-serve")  # compose deployment; a failover's router
BLOCK_TIMEOUT_S = 180.0


def blocks() -> list[str]:
    found = [textwrap.dedent(b) for b in FENCE.findall(GUIDE.read_text())]
    assert len(found) >= 9, f"the guide's bash blocks went missing ({len(found)})"
    return found


def test_the_guides_shell_blocks_run_against_a_real_stack(temporal: Temporal, tmp_path: Path) -> None:
    all_blocks = blocks()
    conventions = all_blocks[0]
    assert "R=http://localhost:8000" in conventions and "SUP=http://localhost:8900" in conventions
    with proc_group(tmp_path) as group:
        s = start_stack(group, tmp_path, n=3)
        # the worker knows the guide's routers ($R, $R2: the one router here), as narwhal-up's does
        session_worker_config().allow_routers([s.router.url])
        worker = start_worker(group, temporal, "narwhal-restart", name="guide-worker")  # the default queue
        wait_ready_line(worker)
        env = {
            **os.environ,
            "PATH": f"{Path(script('narwhal-restart')).parent}:{os.environ['PATH']}",
            "TEMPORAL_ADDRESS": temporal.address,
        }
        hosts = {
            "http://localhost:8000": s.router.url,
            "http://localhost:8001": s.router.url,  # one router: the standby is the same router here
            "http://localhost:8900": s.supervisor,
        }
        prelude = conventions
        for old, new in hosts.items():
            prelude = prelude.replace(old, new)
        ran = skipped = 0
        for n, block in enumerate(all_blocks[1:], start=2):
            if any(word in block for word in SKIPPED):
                skipped += 1
                continue
            body = f"set -euo pipefail\n{prelude}\n{block}"
            try:
                run = subprocess.run(
                    ["bash", "-c", body], capture_output=True, text=True, env=env, timeout=BLOCK_TIMEOUT_S,
                    cwd=tmp_path,
                )  # fmt: skip
            except subprocess.TimeoutExpired as exc:
                raise AssertionError(
                    f"block {n} hangs (> {BLOCK_TIMEOUT_S:g} s):\n{block}\n{exc.stdout!r}"
                ) from None
            assert run.returncode == 0, (
                f"block {n} failed ({run.returncode}):\n{block}\n{run.stdout}\n{run.stderr}"
            )
            assert "Traceback" not in run.stdout + run.stderr, f"block {n}:\n{run.stderr}"
            ran += 1
        assert skipped == 2 and ran >= 7, (ran, skipped)
        engines = s.lifecycle()["engines"]
        assert all(e["state"] == "active" and e["accepts_new"] for e in engines.values())
