"""The one process manager (fleet/procs.py): a process started by a test (or narwhal-up, or the
supervisor) dies with its starter, even when the starter is SIGKILLed (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fleet.procs import Proc, kill_group
from narwhal_testing.procs import REPO

_STARTER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from fleet.procs import {owner}

    log = Path(sys.argv[1])
    child = {start}
    print(child.pid, flush=True)
    time.sleep(600)
    """
)
OWNERS = {
    "Proc": "Proc([sys.executable, '-c', 'import time; time.sleep(600)'], log)",
    "ProcessManager": (
        "ProcessManager(log.parent, log.parent / 'pids.json')"
        ".start('sleeper', [sys.executable, '-c', 'import time; time.sleep(600)'])"
    ),
}


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("owner", sorted(OWNERS))
def test_a_started_process_dies_when_its_starter_is_sigkilled(owner: str, tmp_path: Path) -> None:
    code = _STARTER.format(owner=owner, start=OWNERS[owner])
    starter = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / "child.log")],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    child_pid = 0
    try:
        assert starter.stdout is not None
        child_pid = int(starter.stdout.readline())
        os.kill(child_pid, 0)  # running
        starter.send_signal(signal.SIGKILL)  # like a SIGKILLed pytest: no cleanup runs
        starter.wait(timeout=10)
        # the kernel kills the orphan (it is not ours to reap: poll with signal 0 until it is gone)
        assert _gone(child_pid, within_s=30), f"pid {child_pid} outlived its starter"
    finally:
        if child_pid:
            kill_group(child_pid)
        kill_group(starter.pid)


_XDIST_TEST = textwrap.dedent(
    """
    import ctypes, os, sys, time
    from pathlib import Path
    from fleet.procs import Proc

    def test_starts_a_sleeper(tmp_path):
        child = Proc([sys.executable, "-c", "import time; time.sleep(600)"], tmp_path / "c.log")
        sig = ctypes.c_int(0)
        ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG of this worker
        Path({pids!r}).write_text(f"{{os.getpid()}} {{child.pid}} {{sig.value}}")
        time.sleep(600)
    """
)


def test_an_xdist_worker_and_its_processes_die_when_pytest_is_sigkilled(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    (tmp_path / "test_sleeper.py").write_text(_XDIST_TEST.format(pids=str(pids)))
    pytest_proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "narwhal_testing.xdist",
         "-n", "1", str(tmp_path / "test_sleeper.py")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},  # narwhal_testing: source tree, not installed
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    worker_pid = child_pid = 0
    try:
        deadline = time.monotonic() + 120
        while not (pids.exists() and pids.read_text().strip()):
            assert time.monotonic() < deadline and pytest_proc.poll() is None, "the worker never started"
            time.sleep(0.05)
        worker_pid, child_pid, worker_deathsig = (int(p) for p in pids.read_text().split())
        # the worker asked the kernel to kill it with pytest (without that, execnet notices a dead
        # pytest only when it next looks, and a worker in a long wait runs its test on)
        assert worker_deathsig == signal.SIGKILL
        os.kill(child_pid, 0)  # running
        pytest_proc.send_signal(signal.SIGKILL)  # no cleanup runs in pytest itself
        pytest_proc.wait(timeout=10)
        assert _gone(worker_pid, within_s=30), f"xdist worker {worker_pid} outlived pytest"
        assert _gone(child_pid, within_s=30), f"pid {child_pid} outlived the worker that started it"
    finally:
        for pid in (child_pid, worker_pid):
            if pid:
                kill_group(pid)
        kill_group(pytest_proc.pid)


def test_stop_ends_the_whole_process_group(tmp_path: Path) -> None:
    marker = tmp_path / "grandchild.pid"
    p = Proc(["sh", "-c", f"trap '' TERM; sleep 600 & echo $! > {marker}; wait"], tmp_path / "p.log")
    deadline = time.monotonic() + 30
    while not (marker.exists() and marker.read_text().strip()):
        assert time.monotonic() < deadline and p.alive(), p.output()
        time.sleep(0.05)
    grandchild = int(marker.read_text())
    assert p.stop(timeout=0.3) == -signal.SIGKILL  # SIGTERM ignored: the group was SIGKILLed
    assert _gone(grandchild, within_s=30)
