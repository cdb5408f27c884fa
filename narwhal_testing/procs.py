"""Real-process helpers for tests and benchmarks: free loopback ports, PID-owned subprocesses
(``Proc``, ``ProcGroup``, ``proc_group`` from ``fleet.procs``, the one process manager: own process
group, ``PR_SET_PDEATHSIG``, stopped by PID), waiting for HTTP, console scripts of this venv.

Every process a test starts is stopped by its PID (never by name), even when the test fails, and
dies with the test process if that is killed (SIGKILL included).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx

from fleet.procs import Proc, ProcGroup, proc_group
from fleet.up.ports import free_port
from narwhal_testing import loopback

REPO = Path(__file__).resolve().parents[1]
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
