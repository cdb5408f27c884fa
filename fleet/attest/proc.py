"""The host's view of a process: start time and command line from ``/proc`` (Linux)."""

from __future__ import annotations

import os
import re
from pathlib import Path

PROC = Path("/proc")
_SECRET_FLAG = re.compile(r"(key|token|secret|password)", re.IGNORECASE)


class ProcessGone(Exception):
    """The process does not exist (or is a zombie): it exited."""


def boot_time(proc: Path = PROC) -> float:
    for line in (proc / "stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise OSError("no btime in /proc/stat")


def start_time(pid: int, proc: Path = PROC) -> float:
    """Wall-clock start of ``pid`` (boot time + starttime ticks), as prometheus_client computes it."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        raise ProcessGone(f"no process with PID {pid}") from None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        raise ProcessGone(f"process {pid} exited")
    ticks = int(fields[19])  # field 22 of stat, counted after "pid (comm)"
    return boot_time(proc) + ticks / os.sysconf("SC_CLK_TCK")


def cmdline(pid: int, proc: Path = PROC) -> list[str]:
    """The process's arguments with the values of secret-looking flags redacted."""
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        raise ProcessGone(f"no process with PID {pid}") from None
    args = [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]
    out: list[str] = []
    redact_next = False
    for arg in args:
        if redact_next:
            out.append("<redacted>")
            redact_next = False
            continue
        flag, eq, _ = arg.partition("=")
        if flag.startswith("--") and _SECRET_FLAG.search(flag):
            if eq:
                out.append(f"{flag}=<redacted>")
            else:
                out.append(arg)
                redact_next = True
            continue
        out.append(arg)
    return out


def socket_inodes(pid: int, proc: Path = PROC) -> set[int]:
    """The inodes of the sockets ``pid`` holds open (``/proc/PID/fd`` links ``socket:[N]``).

    Raises ``ProcessGone``, or ``PermissionError`` when this user may not look (another user's
    process: the sidecar runs as the engine's user, or root)."""
    fd_dir = proc / str(pid) / "fd"
    try:
        names = os.listdir(fd_dir)
    except (FileNotFoundError, ProcessLookupError):
        raise ProcessGone(f"no process with PID {pid}") from None
    out: set[int] = set()
    for name in names:
        try:
            target = os.readlink(fd_dir / name)
        except OSError:  # closed since the listing
            continue
        if target.startswith("socket:[") and target.endswith("]"):
            out.add(int(target[8:-1]))
    return out


def listening_inodes(pid: int, port: int, proc: Path = PROC) -> set[int]:
    """The inodes of the TCP sockets listening on ``port`` (any address, IPv4 or IPv6) in the
    network namespace of ``pid`` (``/proc/PID/net/tcp`` and ``tcp6``: state ``0A`` is LISTEN)."""
    out: set[int] = set()
    found = False
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / str(pid) / "net" / table).read_text().splitlines()[1:]
        except FileNotFoundError:  # no IPv6 on this host; or the process is gone (see below)
            continue
        except ProcessLookupError:
            break
        found = True
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":
                continue
            if int(fields[1].rpartition(":")[2], 16) == port:
                out.add(int(fields[9]))
    if not found:
        raise ProcessGone(f"no process with PID {pid}")
    return out


def port_problem(pid: int, port: int, proc: Path = PROC) -> str:
    """Why ``pid`` is not the process serving TCP ``port`` ("" = it holds a socket listening on it).

    Raises ``ProcessGone``."""
    try:
        held = socket_inodes(pid, proc)
    except PermissionError as exc:
        return (
            f"cannot read {proc / str(pid) / 'fd'} ({exc.strerror}) to check that PID {pid} serves port "
            f"{port}: run narwhal-attest as the engine's user"
        )
    if held & listening_inodes(pid, port, proc):
        return ""
    return (
        f"PID {pid} holds no socket listening on port {port} (the engine URL's port): "
        "--engine-pid does not name the engine process"
    )
