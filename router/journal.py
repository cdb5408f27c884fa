"""Request journal (`narwhal.journal` v1): JSONL, a provenance header per process, run ID on every row.

Rows are written by a background thread, so a slow disk never blocks the event loop. Rows appended
on an event loop are handed to that thread in batches: at the end of the loop's iteration, but at
most once per ``HANDOVER_S`` (20 ms) — under load one wake-up of the writer per batch instead of one
per request (each woke a thread that then took the GIL from the loop); rows appended outside a loop,
and whatever is pending at ``close``, are handed over at once.

The file is opened (once, at ``open``; the journal is append-only and never rotated) like the state
files of ``router/ha/statefile.py``: never through a symbolic link (``O_NOFOLLOW``), and only a
regular file. A planted link or a FIFO is refused at start-up (``JournalRefused``: the router exits
naming the path) and nothing outside is written.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import queue
import stat
import subprocess
import threading
import time
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger("narwhal.journal")
SCHEMA = "narwhal.journal"
SCHEMA_VERSION = 1
PACKAGE = "narwhal-restart"
_PACKAGES = ("router", "workflows", "activities", "fleet")
HANDOVER_S = 0.02  # at most one hand-over to the writer thread per this many seconds
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a planted FIFO fails the open instead of blocking it
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class JournalRefused(OSError):
    """The journal path is a symbolic link or not a regular file: refused, never followed."""


def open_append(path: Path) -> int:
    """The journal's fd for appending, opened like the state files: never through a symbolic link
    (``O_NOFOLLOW``), only a regular file. ``JournalRefused`` names the problem; other ``OSError``s
    propagate (the router's start-up reports them and exits)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            raise JournalRefused(
                errno.ELOOP, "journal is a symbolic link (refused, not followed)", str(path)
            ) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise JournalRefused(errno.EINVAL, "journal is not a regular file (refused)", str(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def new_run_id(start_wall: float | None = None) -> str:
    start = time.time() if start_wall is None else start_wall
    return f"{int(start)}-{uuid.uuid4().hex[:8]}"


def source_digest(root: Path | None = None) -> str:
    """sha256 over every package .py file: relative path, NUL, bytes, NUL (sorted by path)."""
    base = root or Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    files = sorted(p for pkg in _PACKAGES for p in (base / pkg).rglob("*.py"))
    for p in files:
        h.update(str(p.relative_to(base)).encode() + b"\0" + p.read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()


def git_describe(root: Path | None = None) -> str | None:
    base = root or Path(__file__).resolve().parent.parent
    if not (base / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=base,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def package_version() -> str:
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return "0+unknown"


class Journal:
    """Append-only JSONL writer. ``path=None`` keeps rows in memory only (tests, no journal flag)."""

    def __init__(self, path: str | Path | None, run_id: str | None = None) -> None:
        self.path = Path(path) if path else None
        self.run_id = run_id or new_run_id()
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._fd = -1  # the journal file, opened (no-follow) by ``open`` and owned by the writer
        self._pending: list[bytes] = []  # rows waiting for the next hand-over to the writer
        self._due = 0.0  # when the scheduled hand-over is late (its loop stopped): schedule another
        self._flushed = 0.0  # the last hand-over
        self.recent: list[dict[str, Any]] = []  # last rows, for introspection

    def open(self) -> None:
        if self.path is None or self._thread is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = open_append(self.path)
        header = {
            "meta": {
                "schema": SCHEMA,
                "schema_version": SCHEMA_VERSION,
                "package": PACKAGE,
                "version": package_version(),
                "git": git_describe(),
                "source": source_digest(),
                "run": self.run_id,
                "pid": os.getpid(),
            }
        }
        self._queue.put(orjson.dumps(header) + b"\n")
        self._thread = threading.Thread(target=self._writer, name="narwhal-journal", daemon=True)
        self._thread.start()

    def append(self, row: dict[str, Any]) -> None:
        doc = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "run": self.run_id, **row}
        self.recent.append(doc)
        if len(self.recent) > 1000:
            del self.recent[:500]
        if self._thread is None:
            return
        pending = self._pending
        pending.append(orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        if len(pending) == 1 or time.monotonic() > self._due:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # not on an event loop: no batching
                self.flush()
                return
            now = time.monotonic()
            if now - self._flushed >= HANDOVER_S:
                loop.call_soon(self.flush)  # light traffic: at the end of this iteration
            else:
                loop.call_later(self._flushed + HANDOVER_S - now, self.flush)
            self._due = now + HANDOVER_S + 1.0

    def flush(self) -> None:
        """Hand the pending rows to the writer thread now."""
        if self._pending:
            batch, self._pending = self._pending, []
            self._flushed = time.monotonic()
            self._queue.put(b"".join(batch))

    def close(self) -> None:
        if self._thread is None:
            return
        self.flush()
        self._queue.put(None)
        self._thread.join(timeout=10)
        self._thread = None

    def _writer(self) -> None:
        fd, self._fd = self._fd, -1
        with os.fdopen(fd, "ab") as fh:
            while True:
                item = self._queue.get()
                if item is None:
                    fh.flush()
                    return
                chunk = [item]
                while True:  # batch whatever is already queued into one write
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        fh.write(b"".join(chunk))
                        fh.flush()
                        return
                    chunk.append(nxt)
                fh.write(b"".join(chunk))
                fh.flush()
