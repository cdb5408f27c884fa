"""Child processes owned by ``narwhal-up``: one process group each, log file each, stopped by PID.

``stop`` sends SIGTERM to the child's PID, waits its grace period, then SIGKILLs the child's own
process group (its PGID is its PID: every child is started with ``start_new_session``). Nothing is
ever looked up or signalled by name. ``write_pids`` keeps ``<state-dir>/pids.json`` current so an
operator (or a test) can see exactly which processes belong to the stack. ``kill`` (the injected
failure of ``narwhal-up --failover``) SIGKILLs one child by its PID and marks it as killed on
purpose, so ``check_alive`` does not treat its death as a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any


class ChildExited(RuntimeError):
    """A child died while ``narwhal-up`` still needed it."""


class Child:
    def __init__(
        self,
        name: str,
        args: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None,
        grace_s: float,
        oneshot: bool = False,
    ) -> None:
        self.name = name
        self.oneshot = oneshot  # a command expected to exit (not a service)
        self.args = list(args)
        self.log_path = log_path
        self.grace_s = grace_s
        self._log: IO[bytes] = log_path.open("ab")
        self._log.write(f"\n=== narwhal-up starts: {' '.join(self.args)}\n".encode())
        self._log.flush()
        self.popen = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            start_new_session=True,  # own session + process group: no terminal Ctrl-C, killpg-able
        )
        self.started_at = time.time()
        self.killed_at: float | None = None  # SIGKILLed on purpose by narwhal-up (--failover)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def tail(self, chars: int = 2000) -> str:
        with contextlib.suppress(ValueError):  # already closed by stop()
            self._log.flush()
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def check_alive(self) -> None:
        if not self.alive() and self.killed_at is None:
            raise ChildExited(
                f"{self.name} (pid {self.pid}) exited with code {self.returncode}; log {self.log_path}:\n"
                + self.tail()
            )

    async def wait(self, within_s: float) -> int | None:
        """The exit code, or None if still running after ``within_s`` seconds."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if not self.alive():
                break
            await asyncio.sleep(0.05)
        return self.returncode

    async def stop(self) -> int | None:
        """SIGTERM by PID, wait ``grace_s``, then SIGKILL the child's process group."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            await self.wait(self.grace_s)
        if self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            await self.wait(5.0)
        # leftovers in the child's own group (not its PID's descendants in other sessions)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=1.0)
        self._log.close()
        return self.returncode


class ProcessManager:
    """Starts children in order; ``stop_all`` stops them in reverse order (or a given order)."""

    def __init__(self, log_dir: Path, pids_path: Path) -> None:
        self.log_dir = log_dir
        self.pids_path = pids_path
        self.children: dict[str, Child] = {}
        self.extra_pids: dict[str, dict[str, int]] = {}

    def start(
        self,
        name: str,
        args: Sequence[str],
        env: dict[str, str] | None = None,
        grace_s: float = 10.0,
        oneshot: bool = False,
    ) -> Child:
        if name in self.children and self.children[name].alive():
            raise RuntimeError(f"{name} is already running")
        child = Child(name, args, self.log_dir / f"{name}.log", env, grace_s, oneshot)
        self.children[name] = child
        self.write_pids()
        return child

    def note_pids(self, group: str, pids: dict[str, int]) -> None:
        """Record processes the stack's children started (e.g. engines under the supervisor)."""
        self.extra_pids[group] = dict(pids)
        self.write_pids()

    def write_pids(self) -> None:
        doc: dict[str, Any] = {
            "narwhal_up": os.getpid(),
            "children": {n: c.pid for n, c in self.children.items()},
            **self.extra_pids,
        }
        tmp = self.pids_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, self.pids_path)

    def check_alive(self, *names: str) -> None:
        """Raise ``ChildExited`` if one of ``names`` (default: every service child) has exited."""
        for name in names or tuple(n for n, c in self.children.items() if not c.oneshot):
            child = self.children.get(name)
            if child is not None:
                child.check_alive()

    async def kill(self, name: str, at: float | None = None) -> Child:
        """SIGKILL ``name`` by its PID (an injected failure: not reported by ``check_alive``).

        ``at`` (default: now) is recorded as ``killed_at``; waits until the child is gone.
        """
        child = self.children[name]
        child.killed_at = time.time() if at is None else at
        os.kill(child.pid, signal.SIGKILL)
        for _ in range(1000):  # up to 5 s, polled finely: callers time the death
            if not child.alive():
                break
            await asyncio.sleep(0.005)
        return child

    async def stop(self, name: str) -> int | None:
        child = self.children.get(name)
        return None if child is None else await child.stop()

    async def stop_all(self, order: Sequence[str] = ()) -> None:
        """Stop the named children first (in that order), then the rest newest first."""
        names = [n for n in order if n in self.children]
        names += [n for n in reversed(self.children) if n not in names]
        for name in names:
            await self.children[name].stop()
