"""The journal under a slow or failing disk: bounded queue, write errors counted and survived, rows
written again when the fault clears, one log line per episode, provenance read off the loop.

The disk is an injected ``write`` (``os.write``'s shape) that blocks or raises real ``OSError``s;
the real full filesystem is in ``tests/integration/test_journal_full_disk.py``.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

import router.journal as journal_mod
from router.journal import Journal
from tests.support.waits import wait_for


class Disk:
    """``os.write`` that can be held (blocks until released) or made to fail with an errno."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()
        self.error: int | None = None
        self.short_once = False  # the next write lands half its bytes, then the fault starts
        self.calls = 0

    def write(self, fd: int, data: memoryview) -> int:
        self.calls += 1
        self.open.wait()
        if self.short_once:
            self.short_once = False
            return os.write(fd, data[: len(data) // 2])
        if self.error is not None:
            raise OSError(self.error, os.strerror(self.error))
        return os.write(fd, data)


def _rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _messages(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_a_full_queue_drops_new_rows_and_counts_them_instead_of_growing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    disk = Disk()
    disk.open.clear()  # the disk takes nothing: the writer blocks in its first write (the header)
    path = tmp_path / "j.jsonl"
    journal = Journal(path, capacity=10, write=disk.write)
    journal.open()
    with caplog.at_level(logging.WARNING, logger="narwhal.journal"):
        for i in range(25):
            journal.append({"event": "request", "i": i})  # off a loop: handed over at once, never waits
    assert journal.queued_rows == 10  # the header and 9 rows: the capacity
    assert journal.dropped_rows == 16
    assert journal.degraded() == "journal queue full (10 rows): new rows dropped; 16 rows dropped"
    assert len(_messages(caplog, "journal queue full")) == 1  # one line for the episode, not per row
    disk.open.set()
    wait_for("the queue written", lambda: journal.queued_rows == 0)
    assert journal.degraded() == ""  # caught up: no longer reported, even before the next row
    journal.append({"event": "request", "i": 99})  # room again: admitted, the episode ends
    journal.close()
    assert journal.degraded() == ""
    assert [r.get("i") for r in _rows(path)[1:]] == [*range(9), 99]
    assert _messages(caplog, "queue has room again") == [
        "journal queue has room again; 16 rows dropped so far"
    ]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO, errno.EROFS])
def test_the_writer_survives_write_errors_keeps_its_rows_and_writes_them_when_the_fault_clears(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    disk = Disk()
    path = tmp_path / "j.jsonl"
    journal = Journal(path, write=disk.write, retry_s=0.01)
    journal.open()
    journal.append({"event": "before"})
    wait_for("the first rows written", lambda: journal.queued_rows == 0)
    disk.error = code
    with caplog.at_level(logging.WARNING, logger="narwhal.journal"):
        for i in range(5):
            journal.append({"event": "during", "i": i})
        wait_for("several failed attempts", lambda: journal.write_errors >= 3)
        name = errno.errorcode[code]
        assert journal.degraded() == f"journal write failing: {os.strerror(code)} ({name})"
        assert journal.dropped_rows == 0 and journal.queued_rows == 5  # kept, within the capacity
        disk.error = None
        wait_for("rows written again", lambda: journal.degraded() == "" and journal.queued_rows == 0)
        journal.append({"event": "after"})
        journal.close()
    rows = _rows(path)
    assert [r.get("event") for r in rows[1:]] == ["before", *["during"] * 5, "after"]
    assert [r["i"] for r in rows if r.get("event") == "during"] == list(range(5))
    failed = _messages(caplog, "journal write failed")
    assert failed == [
        f"journal write failed: {os.strerror(code)} ({name}); rows kept (up to the queue capacity, "
        "then dropped and counted), retrying every 0.01s"
    ]
    assert len(_messages(caplog, "journal writes recovered after")) == 1


def test_a_row_cut_short_by_the_fault_is_completed_once_not_torn_or_repeated(tmp_path: Path) -> None:
    disk = Disk()
    path = tmp_path / "j.jsonl"
    journal = Journal(path, write=disk.write, retry_s=0.01)
    journal.open()
    wait_for("the header written", lambda: journal.queued_rows == 0)
    disk.short_once, disk.error = True, errno.ENOSPC
    journal.append({"event": "cut", "text": "x" * 200})
    wait_for("the write failed after the short write", lambda: journal.write_errors >= 1)
    disk.error = None
    wait_for("written again", lambda: journal.queued_rows == 0)
    journal.close()
    rows = _rows(path)  # every line parses: the tail was appended right after the head
    assert [r.get("event") for r in rows[1:]] == ["cut"] and rows[1]["text"] == "x" * 200


def test_close_on_a_failing_disk_returns_and_counts_the_rows_it_could_not_write(tmp_path: Path) -> None:
    disk = Disk()
    journal = Journal(tmp_path / "j.jsonl", write=disk.write, retry_s=3600.0)  # close must not wait it out
    journal.open()
    wait_for("the header written", lambda: journal.queued_rows == 0)
    disk.error = errno.EIO
    for i in range(4):
        journal.append({"event": "lost", "i": i})
    wait_for("the write failed", lambda: journal.write_errors >= 1)
    journal.close()
    assert journal.dropped_rows == 4 and journal.queued_rows == 0
    assert journal.write_errors == 2  # the failed write and the one last attempt at close


class _Families(Collector):
    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def collect(self) -> list[Metric]:
        return list(self.journal.families())


def test_metrics_report_write_errors_dropped_and_queued_rows(tmp_path: Path) -> None:
    disk = Disk()
    journal = Journal(tmp_path / "j.jsonl", capacity=3, write=disk.write, retry_s=0.01)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(journal))
    text = generate_latest(registry).decode()
    assert "narwhal_journal_write_errors_total 0.0" in text and "narwhal_journal_degraded 0.0" in text
    journal.open()
    wait_for("the header written", lambda: journal.queued_rows == 0)
    disk.error = errno.ENOSPC
    for i in range(5):
        journal.append({"i": i})
    wait_for("two failed attempts", lambda: journal.write_errors >= 2)
    text = generate_latest(registry).decode()
    assert "# TYPE narwhal_journal_write_errors_total counter" in text
    assert "narwhal_journal_dropped_rows_total 2.0" in text  # capacity 3: three kept, two dropped
    assert "narwhal_journal_queued_rows 3.0" in text and "narwhal_journal_degraded 1.0" in text
    disk.error = None
    journal.close()


async def test_start_reads_the_provenance_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    real_digest = journal_mod.source_digest

    def digest(root: Path | None = None) -> str:
        threads.append(threading.current_thread().name)
        return real_digest(root)

    monkeypatch.setattr(journal_mod, "source_digest", digest)
    journal = Journal(tmp_path / "j.jsonl")
    await journal.start()
    journal.close()
    assert threads and threads[0] != threading.current_thread().name  # not the loop's thread
    assert "meta" in _rows(tmp_path / "j.jsonl")[0]


def test_a_writer_that_stops_on_a_bug_says_so_and_the_queue_stays_bounded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def buggy(fd: int, data: memoryview) -> int:
        raise TypeError("not a disk error")

    journal = Journal(tmp_path / "j.jsonl", capacity=4, write=buggy)
    with caplog.at_level(logging.ERROR, logger="narwhal.journal"):
        journal.open()
        wait_for("the writer stopped", lambda: journal.degraded())
    assert journal.degraded() == "journal write failing: writer stopped: TypeError: not a disk error"
    assert _messages(caplog, "journal writer stopped") == [
        "journal writer stopped; rows are no longer written"
    ]
    for i in range(10):
        journal.append({"i": i})
    assert journal.queued_rows == 4 and journal.dropped_rows == 7  # the header and 3 rows kept
    journal.close()
