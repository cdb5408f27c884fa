"""Request journal (`narwhal.journal` v1): JSONL, a provenance header per process, run ID on every row.

Rows are written by a background thread (``router/journal_writer.py``), so a slow disk never
blocks the event loop. Rows appended on an event loop are handed to that thread in batches: at the
end of the loop's iteration, but at most once per ``HANDOVER_S`` (20 ms) — under load one wake-up of
the writer per batch instead of one per request (each woke a thread that then took the GIL from the
loop); rows appended outside a loop, and whatever is pending at ``close``, are handed over at once.

Bounded: at most ``capacity`` rows (``CAPACITY_ROWS``, 50 000: about 35 MB of 700-byte rows) are
handed over and not yet written — a loop appending 60 000 rows a second ran up to 14 000 ahead of
its writer (``/tmp``-style local disk), so a healthy disk never reaches the bound. A row appended
while that many wait is dropped and counted (``dropped_rows``), never queued and never waited for:
a disk that is slow or failing costs journal rows, not memory and not serving.
While writes fail the writer keeps the rows it holds and retries (its rule); ``degraded()`` says
why rows are not being written ("" when they are) for ``/ready``'s ``journal_degraded``, which does
not make the router unready — serving goes on, as with ``control_degraded``. ``families()`` are the
``narwhal_journal_*`` metrics. One log line when dropping starts and one when the queue has room
again (below half its capacity), never one per row.

``open`` reads the provenance (hashes every package file, runs ``git describe``) and opens the
file: blocking work, so the app's start-up runs it in a worker thread (``start``).

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
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from router.journal_writer import RETRY_S, JournalWriter, WriteFn

log = logging.getLogger("narwhal.journal")
SCHEMA = "narwhal.journal"
SCHEMA_VERSION = 1
PACKAGE = "narwhal-restart"
_PACKAGES = ("router", "workflows", "activities", "fleet")
HANDOVER_S = 0.02  # at most one hand-over to the writer thread per this many seconds
CAPACITY_ROWS = 50_000  # rows handed over and not yet written, at most (then new rows are dropped)
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
    """Append-only JSONL writer. ``path=None`` keeps rows in memory only (tests, no journal flag).

    ``capacity`` bounds the rows waiting for the writer; ``write`` and ``retry_s`` are the writer's
    (``os.write`` and 1 s; tests inject a failing write)."""

    def __init__(
        self,
        path: str | Path | None,
        run_id: str | None = None,
        *,
        capacity: int = CAPACITY_ROWS,
        write: WriteFn = os.write,
        retry_s: float = RETRY_S,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"journal capacity must be at least 1 row, got {capacity}")
        self.path = Path(path) if path else None
        self.run_id = run_id or new_run_id()
        self.capacity = capacity
        self._write = write
        self._retry_s = retry_s
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._writer: JournalWriter | None = None
        self._pending: list[bytes] = []  # rows waiting for the next hand-over to the writer
        self._handed = 0  # rows handed to the writer (its ``settled`` of them are done)
        self._dropped = 0  # rows refused because the queue was full
        self._dropping = False  # dropping since the queue filled; ends below half capacity
        self._due = 0.0  # when the scheduled hand-over is late (its loop stopped): schedule another
        self._flushed = 0.0  # the last hand-over
        self.recent: list[dict[str, Any]] = []  # last rows, for introspection

    async def start(self) -> None:
        """``open`` in a worker thread: provenance hashing and ``git describe`` stay off the loop."""
        await asyncio.to_thread(self.open)

    def open(self) -> None:
        if self.path is None or self._thread is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = open_append(self.path)
        try:
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
        except BaseException:
            os.close(fd)
            raise
        self._writer = JournalWriter(fd, self._queue, write=self._write, retry_s=self._retry_s)
        self._handed += 1
        self._queue.put(orjson.dumps(header) + b"\n")
        self._thread = threading.Thread(target=self._writer.run, name="narwhal-journal", daemon=True)
        self._thread.start()

    # -- what /ready and /metrics read ---------------------------------------------------------
    @property
    def queued_rows(self) -> int:
        """Rows appended for the file and not yet written (or given up)."""
        settled = self._writer.settled if self._writer is not None else 0
        return self._handed - settled + len(self._pending)

    @property
    def write_errors(self) -> int:
        return self._writer.write_errors if self._writer is not None else 0

    @property
    def dropped_rows(self) -> int:
        """Rows never written: refused while the queue was full, or given up at close."""
        return self._dropped + (self._writer.abandoned if self._writer is not None else 0)

    def degraded(self) -> str:
        """Why rows are not being written ("" when they are)."""
        failing = self._writer.failing if self._writer is not None else ""
        parts = [f"journal write failing: {failing}"] if failing else []
        if self._dropping and self.queued_rows >= self.capacity // 2:  # the writer has not caught up
            parts.append(f"journal queue full ({self.capacity} rows): new rows dropped")
        if parts and self.dropped_rows:
            parts.append(f"{self.dropped_rows} rows dropped")
        return "; ".join(parts)

    def families(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "narwhal_journal_write_errors_total",
            "Journal writes that failed (ENOSPC, EIO, EROFS, ...); each retry counts.",
            value=self.write_errors,
        )
        yield CounterMetricFamily(
            "narwhal_journal_dropped_rows_total",
            "Journal rows never written: the queue was full, or the file failed at close.",
            value=self.dropped_rows,
        )
        yield GaugeMetricFamily(
            "narwhal_journal_queued_rows", "Journal rows waiting for the writer.", value=self.queued_rows
        )
        yield GaugeMetricFamily(
            "narwhal_journal_degraded",
            "1 while journal rows are not being written.",
            value=int(bool(self.degraded())),
        )

    # -- appending -------------------------------------------------------------------------
    def append(self, row: dict[str, Any]) -> None:
        doc = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "run": self.run_id, **row}
        self.recent.append(doc)
        if len(self.recent) > 1000:
            del self.recent[:500]
        writer = self._writer
        if writer is None or self._thread is None:
            return
        pending = self._pending
        queued = self._handed - writer.settled + len(pending)
        if queued >= self.capacity:
            self._drop()
            return
        if self._dropping and queued < self.capacity // 2:
            self._dropping = False
            log.warning("journal queue has room again; %d rows dropped so far", self._dropped)
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

    def _drop(self) -> None:
        self._dropped += 1
        if not self._dropping:
            self._dropping = True
            log.warning(
                "journal queue full (%d rows not yet written): dropping new rows until it has room",
                self.capacity,
            )

    def flush(self) -> None:
        """Hand the pending rows to the writer thread now."""
        if self._pending:
            batch, self._pending = self._pending, []
            self._flushed = time.monotonic()
            self._handed += len(batch)
            self._queue.put(b"".join(batch))

    def close(self) -> None:
        if self._thread is None:
            return
        self.flush()
        self._queue.put(None)
        self._thread.join(timeout=10)
        self._thread = None
