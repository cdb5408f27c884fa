"""Real-process helpers for tests and benchmarks: free loopback ports, PID-owned subprocesses
(``Proc``, ``ProcGroup``, ``proc_group`` from ``fleet.procs``, the one process manager: own process
group, ``PR_SET_PDEATHSIG``, stopped by PID), waiting for HTTP, console scripts of this venv.

Every process a test starts is stopped by its PID (never by name), even when the test fails, and
dies with the test process if that is killed (SIGKILL included).
"""

from __future__ import annotations

import os
import random
import socket
import sys
import time
from pathlib import Path

import httpx

from fleet.procs import Proc, ProcGroup, proc_group
from fleet.testing import loopback

REPO = Path(__file__).resolve().parents[2]
__all__ = [
    "BIN",
    "REPO",
    "Proc",
    "ProcGroup",
    "free_port",
    "proc_group",
    "script",
    "wait_http",
]
BIN = Path(sys.executable).parent


_handed_out: set[int] = set()
_rng = random.Random(os.getpid() ^ time.monotonic_ns())


def _port_range() -> tuple[int, int]:
    """20000-32000, or this pytest-xdist worker's own slice of it (``gw0`` … ``gwN``).

    Parallel test workers are separate processes that cannot see each other's handed-out ports;
    a disjoint slice each means one worker never picks a port another has picked and not yet bound.
    """
    low, high = 20000, 32000
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or "1")
    if worker.startswith("gw") and worker[2:].isdigit() and count > 1:
        width = (high - low) // count
        low += int(worker[2:]) * width
        high = low + width
    return low, high


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range (32768+), never handed out twice.

    Ports from the ephemeral range can be taken by any outgoing connection between the moment a
    test picks one and the moment its server binds it; ports below that range cannot.
    """
    low, high = _port_range()
    for _ in range(200):
        port = _rng.randrange(low, high)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free loopback port found in {low}-{high}")


def wait_http(
    url: str, timeout: float = 20.0, proc: Proc | None = None, ok: tuple[int, ...] = (200,)
) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"process exited before {url} answered:\n{proc.output()[-3000:]}")
        try:
            r = loopback.get(url, timeout=1.0)
            if r.status_code in ok:
                return
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.05)
    tail = proc.output()[-3000:] if proc is not None else ""
    raise TimeoutError(f"{url} not answering {ok} after {timeout}s ({last})\n{tail}")


def script(name: str) -> str:
    """Path of a console script installed in this venv."""
    return str(BIN / name)
