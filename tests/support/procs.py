"""Real-process helpers for integration tests: free loopback ports, PID-owned subprocesses.

Every process a test starts is stopped by its PID (never by name), even when the test fails.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


_handed_out: set[int] = set()
_rng = random.Random(os.getpid() ^ time.monotonic_ns())


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range (32768+), never handed out twice.

    Ports from the ephemeral range can be taken by any outgoing connection between the moment a
    test picks one and the moment its server binds it; ports below that range cannot.
    """
    for _ in range(200):
        port = _rng.randrange(20000, 32000)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError("no free loopback port found in 20000-32000")


class Proc:
    """A subprocess owned by a test; ``stop`` kills it (and its process group) by PID."""

    def __init__(self, args: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.args = list(args)
        self.log_path = log_path
        self._log = log_path.open("ab")
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.popen = subprocess.Popen(
            self.args, stdout=self._log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def kill9(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
        # children in its session that outlived it (started with start_new_session)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self._log.close()
        return self.popen.returncode

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")


class ProcGroup:
    """Collects Procs; ``close`` stops them all in reverse start order."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[Proc] = []

    def start(self, name: str, args: Sequence[str], env: dict[str, str] | None = None) -> Proc:
        p = Proc(args, self.log_dir / f"{name}.{len(self.procs)}.log", env)
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in reversed(self.procs):
            p.stop()


@contextlib.contextmanager
def proc_group(log_dir: Path) -> Iterator[ProcGroup]:
    group = ProcGroup(log_dir)
    try:
        yield group
    finally:
        group.close()


def wait_http(
    url: str, timeout: float = 20.0, proc: Proc | None = None, ok: tuple[int, ...] = (200,)
) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"process exited before {url} answered:\n{proc.output()[-3000:]}")
        try:
            r = httpx.get(url, timeout=1.0)
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
