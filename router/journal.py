"""Request journal (`narwhal.journal` v1): JSONL, a provenance header per process, run ID on every row.

Rows are written by a background thread, so a slow disk never blocks the event loop. Rows appended
on an event loop are handed to that thread in batches: at the end of the loop's iteration, but at
most once per ``HANDOVER_S`` (20 ms) — under load one wake-up of the writer per batch instead of one
per request (each woke a thread that then took the GIL from the loop); rows appended outside a loop,
and whatever is pending at ``close``, are handed over at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import queue
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
        self._pending: list[bytes] = []  # rows waiting for the next hand-over to the writer
        self._due = 0.0  # when the scheduled hand-over is late (its loop stopped): schedule another
        self._flushed = 0.0  # the last hand-over
        self.recent: list[dict[str, Any]] = []  # last rows, for introspection

    def open(self) -> None:
        if self.path is None or self._thread is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
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
        assert self.path is not None
        with self.path.open("ab") as fh:
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
