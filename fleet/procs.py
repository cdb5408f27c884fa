"""The one process manager: child processes started in their own process group, with a log file,
stopped by PID — used by ``narwhal-up``, the supervisor, the tests and the benchmarks.

* ``spawn`` / ``spawn_async`` start a child in its own session (its PGID is its PID, so its whole
  group can be SIGKILLed; no terminal signals reach it) with ``PR_SET_PDEATHSIG`` = SIGKILL: when
  the process that started it dies — even by SIGKILL — the kernel kills the child too, so nothing
  outlives a killed ``pytest``, ``narwhal-up`` or supervisor. (Linux sends the death signal when
  the *thread* that forked the child exits: start children from a long-lived thread, such as the
  main thread or the event loop's.)
* ``stop_pid`` / ``stop_pid_async``: SIGTERM to the PID, wait the grace period, SIGKILL the child's
  process group, reap it. Nothing is ever looked up or signalled by name.
* ``Proc`` / ``ProcGroup`` (synchronous, tests and benches) and ``Child`` / ``ProcessManager``
  (asyncio, ``narwhal-up``) are thin owners over those two.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """``preexec_fn``: ask the kernel to SIGKILL this child when its parent dies."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def child_env(env: dict[str, str] | None) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}


def spawn(
    args: Sequence[str],
    log: IO[bytes] | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``args`` in its own session, output to ``log`` (or discarded), dying with us."""
    out: IO[bytes] | int = log if log is not None else subprocess.DEVNULL
    return subprocess.Popen(
        list(args),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        env=child_env(env),
        start_new_session=True,
        preexec_fn=die_with_parent,
    )


async def spawn_async(args: Sequence[str], env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    """``spawn`` for asyncio owners (the supervisor's engines): inherits our stdout/stderr."""
    return await asyncio.create_subprocess_exec(
        *args, start_new_session=True, preexec_fn=die_with_parent, env=env
    )


def kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads (the child and whatever it started in its session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def stop_pid(popen: subprocess.Popen[bytes], grace_s: float) -> int | None:
    """SIGTERM by PID, wait ``grace_s``, then SIGKILL its process group; reaps the child."""
    if popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(popen.pid, signal.SIGTERM)
        try:
            popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            kill_group(popen.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=10)
    kill_group(popen.pid)  # leftovers in its session that outlived it
    return popen.poll()


async def stop_pid_async(popen: subprocess.Popen[bytes], grace_s: float) -> int | None:
    """``stop_pid`` without blocking the event loop."""
    if popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(popen.pid, signal.SIGTERM)
        await wait_exit(popen, grace_s)
    if popen.poll() is None:
        kill_group(popen.pid)
        await wait_exit(popen, 5.0)
    kill_group(popen.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        popen.wait(timeout=1.0)
    return popen.poll()


async def wait_exit(popen: subprocess.Popen[bytes], within_s: float) -> int | None:
    """The exit code, or None if still running after ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            break
        await asyncio.sleep(0.05)
    return popen.poll()


# -- synchronous owners (tests, benchmarks) -------------------------------------------------------


class Proc:
    """A child owned by a test or a benchmark; ``stop`` ends it (and its process group) by PID."""

    def __init__(self, args: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.args = list(args)
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.popen = spawn(self.args, self._log, env)

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
        code = stop_pid(self.popen, timeout)
        self._log.close()
        return code

    def output(self) -> str:
        with contextlib.suppress(ValueError):  # closed by stop()
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


# -- asyncio owners (narwhal-up) --------------------------------------------------------------------


class ChildExited(RuntimeError):
    """A child died while its owner still needed it."""


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
        self.popen = spawn(self.args, self._log, env)
        self.started_at = time.time()
        self.killed_at: float | None = None  # SIGKILLed on purpose by its owner (--failover)

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
        return await wait_exit(self.popen, within_s)

    async def stop(self) -> int | None:
        """SIGTERM by PID, wait ``grace_s``, then SIGKILL the child's process group."""
        code = await stop_pid_async(self.popen, self.grace_s)
        self._log.close()
        return code


class ProcessManager:
    """Starts children in order; ``stop_all`` stops them in reverse order (or a given order).

    ``write_pids`` keeps ``pids.json`` current so an operator (or a test) sees exactly which
    processes belong to the stack. ``kill`` (an injected failure) SIGKILLs one child by its PID and
    marks it as killed on purpose, so ``check_alive`` does not treat its death as a crash.
    """

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
