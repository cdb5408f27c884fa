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
