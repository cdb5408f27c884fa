"""``narwhal-up --replicas 3 --etcd``: three active-active replicas, the load spread over them, a
rolling restart through one replica, no failed request; nothing left running afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration import test_narwhal_up as base
from tests.integration.test_narwhal_up import Up, alive, all_pids, port_flags
from tests.support.etcd import etcd_installed
from tests.support.procs import free_port

pytestmark = pytest.mark.integration
up_runner = base.up_runner  # the same fixture: every narwhal-up started here is stopped by PID


def test_three_replicas_serve_the_load_through_a_rolling_restart(tmp_path: Path, up_runner: list[Up]) -> None:
    if not etcd_installed():
        pytest.fail("etcd is not installed (scripts/bootstrap.sh installs Debian's etcd-server)")
    state = tmp_path / "replicas"
    args = [
        "--engines", "2", "--prefill", "0", "--restart", "rolling", "--fast", "--state-dir", str(state),
        "--etcd", "--replicas", "3", "--etcd-port", str(free_port()), "--etcd-peer-port", str(free_port()),
    ]  # fmt: skip
    up = Up([*args, *port_flags(2)], tmp_path / "replicas.out")
    up_runner.append(up)
    rc = up.proc.wait(timeout=180)
    out = up.output()
    assert rc == 0, out[-5000:]
    assert "active-active, every one serves" in out
    assert "result:   OK — 2/2 engines restarted, 0 failed requests" in out, out[-3000:]
    summary = json.loads((state / "summary.json").read_text())
    assert summary["ok"] is True and summary["total"]["failed"] == 0
    served_by = {url: n for url, n in summary["total"]["by_router"].items() if n > 0}
    assert len(served_by) == 3, served_by  # the load was spread over every replica
    assert [p for p in all_pids(state) if alive(p)] == []


def test_replicas_need_etcd(tmp_path: Path) -> None:
    import subprocess

    from tests.support.procs import script

    proc = subprocess.run(
        [script("narwhal-up"), "--replicas", "3", "--state-dir", str(tmp_path / "x")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--replicas N needs N >= 2 and --etcd" in proc.stderr
