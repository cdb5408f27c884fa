"""The journal's writer thread: writes the batches handed to it, survives write errors, recovers.

Rule for rows while the file cannot take them (ENOSPC, EIO, EROFS, any ``OSError`` of the write):
the rows already handed over are **kept**, in order, and the write is retried every ``retry_s``
(1 s); the journal's bounded queue (``router/journal.py``) then fills, and rows appended while it is
full are dropped and counted there. When a retry succeeds the kept rows are written in order (a
row the failing write cut short is completed, never duplicated: the writer resumes at the byte the
file stopped at) and writing goes on — no fault leaves the writer dead after it clears. At close
one last attempt is made; rows it cannot write are dropped and counted (``abandoned``). Anything
but an ``OSError`` is a bug: the writer stops and says so (``failing``: ``writer stopped: …``, and a
logged traceback) instead of dying silently; the bounded queue then drops and counts new rows.

One log line when a failure episode starts (the first failed write after a good one) and one when
it ends; never one per row or per retry. The counters are plain integers owned by this thread
(read by the event loop for ``/metrics`` and ``/ready``).
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import time
from collections.abc import Callable

log = logging.getLogger("narwhal.journal")
RETRY_S = 1.0  # while writes fail: one attempt per this many seconds

WriteFn = Callable[[int, memoryview], int]  # ``os.write``'s shape: bytes written (may be short)


def describe(exc: OSError) -> str:
    """``No space left on device (ENOSPC)``: the error as an operator reads it."""
    name = errno.errorcode.get(exc.errno or 0, "")
    text = exc.strerror or str(exc)
    return f"{text} ({name})" if name else text


class JournalWriter:
    """Runs on the journal's thread (``run``); ``source`` delivers batches of whole rows, ``None``
    to close. The fd is owned here and closed when ``run`` returns."""

    def __init__(
        self,
        fd: int,
        source: queue.SimpleQueue[bytes | None],
        *,
        write: WriteFn = os.write,
        retry_s: float = RETRY_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fd = fd
        self.source = source
        self._write = write
        self.retry_s = retry_s
        self._monotonic = monotonic
        # rows written or abandoned: the journal's queue holds ``handed - settled`` rows
        self.settled = 0
        self.written = 0  # rows on disk
        self.write_errors = 0  # failed write attempts (each retry that fails counts)
        self.abandoned = 0  # rows dropped at close because the file could not take them
        self.failing = ""  # why the last write failed; "" while writes succeed
        self._episode_errors = 0
        self._pending: list[bytes] = []  # handed over, not yet written (the head may be a tail)
        self._rows = 0  # whole rows in ``_pending``
        self._closing = False

    def run(self) -> None:
        try:
            while not self._closing or self._pending:
                if not self._pending:
                    self._take(self.source.get())
                self._take_queued()
                if not self._pending:
                    continue
                if self._write_pending():
                    continue
                if self._closing:  # the last attempt failed: give the rows up, counted
                    self._abandon()
                else:
                    self._wait_retry()
        except Exception as exc:  # a bug, not the disk: say so (``/ready``, the log), never silently
            log.exception("journal writer stopped; rows are no longer written")
            self.failing = f"writer stopped: {type(exc).__name__}: {exc}"
        finally:
            os.close(self.fd)

    def _take(self, item: bytes | None) -> None:
        if item is None:
            self._closing = True
        else:
            self._pending.append(item)
            self._rows += item.count(b"\n")

    def _take_queued(self) -> None:
        """Batch whatever is already queued into one write."""
        while not self._closing:
            try:
                item = self.source.get_nowait()
            except queue.Empty:
                return
            self._take(item)

    def _write_pending(self) -> bool:
        data = b"".join(self._pending)
        view = memoryview(data)
        done = 0
        try:
            while done < len(data):
                n = self._write(self.fd, view[done:])
                if n <= 0:
                    raise OSError(errno.EIO, "write made no progress")
                done += n
        except OSError as exc:
            self._pending = [data[done:]]
            self._failed(exc)
            return False
        finally:
            view.release()
        self._pending = []
        self.settled += self._rows
        self.written += self._rows
        self._rows = 0
        if self.failing:
            log.warning(
                "journal writes recovered after %d failed attempts (%s); kept rows written",
                self._episode_errors,
                self.failing,
            )
            self.failing = ""
            self._episode_errors = 0
        return True

    def _failed(self, exc: OSError) -> None:
        self.write_errors += 1
        self._episode_errors += 1
        if not self.failing:
            log.warning(
                "journal write failed: %s; rows kept (up to the queue capacity, then dropped and "
                "counted), retrying every %gs",
                describe(exc),
                self.retry_s,
            )
        self.failing = describe(exc)

    def _wait_retry(self) -> None:
        """Collect handed-over rows for ``retry_s`` (or until close), then the caller retries."""
        until = self._monotonic() + self.retry_s
        while not self._closing:
            left = until - self._monotonic()
            if left <= 0:
                return
            try:
                self._take(self.source.get(timeout=left))
            except queue.Empty:
                return

    def _abandon(self) -> None:
        log.error("journal closed with %d rows not written: %s", self._rows, self.failing)
        self.abandoned += self._rows
        self.settled += self._rows
        self._pending = []
        self._rows = 0
