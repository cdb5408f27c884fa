"""``narwhal-up`` as a real process: the whole stack, a rolling restart under load, a clean Ctrl-C.

Every port is passed explicitly (free loopback ports), the state dir is a tmp dir, and every
process the test starts is stopped by PID in a ``finally``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.procs import spawn
from fleet.up.ports import port_free
from tests.support.procs import REPO, free_port, script

pytestmark = pytest.mark.integration


def engine_base(n: int) -> int:
    """A port P with P..P+n-1 all free."""
    for _ in range(200):
        base = free_port()
        if base + n < 65536 and all(port_free(base + i) for i in range(n)):
            return base
    raise RuntimeError("no run of free ports")


def port_flags(n_engines: int) -> list[str]:
    flags = ["--engine-base-port", str(engine_base(n_engines))]
    for flag in (
        "--temporal-port", "--temporal-http-port", "--temporal-metrics-port", "--ui-port",
        "--supervisor-port", "--router-port", "--standby-port",
    ):  # fmt: skip
        flags += [flag, str(free_port())]
    return flags


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie we are the parent of is not "running"
        waited, _ = os.waitpid(pid, os.WNOHANG)
        return waited == 0
    except ChildProcessError:
        return True


def all_pids(state_dir: Path) -> list[int]:
    doc: dict[str, Any] = json.loads((state_dir / "pids.json").read_text())
    return [int(p) for group in ("children", "engines") for p in doc.get(group, {}).values()]


class Up:
    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        self._out = log.open("wb")
        # own process group, dies with the test process (fleet.procs); narwhal-up's own children
        # die with narwhal-up in turn
        self.proc = spawn([script("narwhal-up"), *args], self._out, cwd=REPO)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"narwhal-up never printed {text!r}:\n{self.output()[-4000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._out.close()


@pytest.fixture
def up_runner(tmp_path: Path) -> Iterator[list[Up]]:
    started: list[Up] = []
    try:
        yield started
    finally:
        for up in started:
            up.stop()
        # whatever narwhal-up recorded must be gone even if a test failed half-way
        for pids_file in tmp_path.glob("*/pids.json"):
            for pid in all_pids(pids_file.parent):
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)


def test_rolling_restart_under_load_restarts_every_engine_without_failed_requests(
    tmp_path: Path, up_runner: list[Up]
) -> None:
    state = tmp_path / "rolling"
    args = ["--engines", "2", "--prefill", "0", "--restart", "rolling", "--fast", "--state-dir", str(state)]
    up = Up([*args, *port_flags(2)], tmp_path / "rolling.out")
    up_runner.append(up)
    rc = up.proc.wait(timeout=120)
    out = up.output()
    assert rc == 0, out[-5000:]
    assert "rolling restart: done" in out and "2/2 engines restarted" in out, out[-3000:]
    assert "result:   OK — 2/2 engines restarted, 0 failed requests" in out
    summary = json.loads((state / "summary.json").read_text())
    assert summary["ok"] is True and summary["all_restarted"] is True
    assert summary["total"]["failed"] == 0
    assert summary["during_restart"]["served"] > 0  # the load really ran through the restart
    assert summary["during_restart"]["streamed"] > 0 and summary["during_restart"]["buffered"] > 0
    for e in summary["engines"]:
        assert e["restarted"] and e["new_process_start"] > e["old_process_start"], e
        assert e["new_pid"] != e["old_pid"], e
    assert "/namespaces/default/workflows/narwhal-restart-narwhal-up" in summary["workflow_url"]
    # nothing it started outlives it
    pids = all_pids(state)
    assert len(pids) >= 2 + 6  # engines + temporal, supervisor, 2 routers, worker, restart-cli
    assert [p for p in pids if alive(p)] == []


def test_failover_kills_the_primary_mid_restart_and_the_standby_takes_over(
    tmp_path: Path, up_runner: list[Up]
) -> None:
    state = tmp_path / "failover"
    args = ["--engines", "4", "--restart", "rolling", "--fast", "--failover", "--state-dir", str(state)]
    up = Up([*args, *port_flags(4)], tmp_path / "failover.out")
    up_runner.append(up)
    rc = up.proc.wait(timeout=240)  # a bound for a hung run: it ends on its own events (80 s at load 9)
    out = up.output()
    assert rc == 0, out[-5000:]
    assert "SIGKILL router-primary" in out and "cut by the injected router kill:" in out, out[-3000:]
    summary = json.loads((state / "summary.json").read_text())
    assert summary["ok"] is True and summary["all_restarted"] is True, summary
    assert all(e["restarted"] for e in summary["engines"]) and len(summary["engines"]) == 4
    assert summary["total"]["failed"] == 0, summary["total"]  # cut requests are reported apart
    [takeover] = summary["takeovers"]
    assert (takeover["router"], takeover["epoch_before"], takeover["epoch_after"]) == ("standby", 1, 2)
    fo = summary["failover"]
    assert fo["injected"] and fo["router"] == "primary" and fo["epoch_after"] == 2, fo
    assert fo["standby_ready_at"] > fo["killed_at"], fo
    doc = json.loads((state / "pids.json").read_text())
    assert doc["killed"]["router-primary"] == fo["pid"]
    pids = [*all_pids(state), *doc["killed"].values()]
    assert [p for p in pids if alive(p)] == []


def test_sigint_with_keep_running_stops_every_process(tmp_path: Path, up_runner: list[Up]) -> None:
    state = tmp_path / "keep"
    args = ["--engines", "2", "--restart", "none", "--fast", "--keep-running", "--state-dir", str(state)]
    up = Up([*args, *port_flags(2)], tmp_path / "keep.out")
    up_runner.append(up)
    up.wait_for("narwhal-up: ready", timeout=60)
    up.wait_for("press Ctrl-C to stop", timeout=30)
    pids = all_pids(state)
    assert len(pids) == 2 + 5  # engines + temporal, supervisor, 2 routers, worker
    assert all(alive(p) for p in pids)
    os.kill(up.proc.pid, signal.SIGINT)
    rc = up.proc.wait(timeout=60)
    assert rc == 0, up.output()[-3000:]  # stopped after a clean summary: the verdict stands
    assert "SIGINT: stopping everything" in up.output()
    assert [p for p in pids if alive(p)] == []


def test_refuses_before_starting_anything(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run(
            [script("narwhal-up"), "--temporal-port", str(port), "--state-dir", str(tmp_path / "s")],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    assert r.returncode == 2
    assert f"temporal port {port} is in use; pass --temporal-port N or --base-port N" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "s").exists()  # nothing was started, not even the state dir
    r = subprocess.run(
        [script("narwhal-up"), "--engines", "2", "--restart", "rolling", "--state-dir", str(tmp_path / "s")],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert r.returncode == 2
    assert "single prefill engine" in r.stderr and "--prefill 0" in r.stderr
