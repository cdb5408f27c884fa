"""Request journal: provenance header per process, run ID on every row, non-blocking writes."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
from pathlib import Path

import pytest

from router.journal import Journal, JournalRefused, new_run_id, source_digest


def test_run_id_format() -> None:
    assert re.fullmatch(r"1795966346-[0-9a-f]{8}", new_run_id(1795966346.7))


def test_header_and_rows_carry_provenance_and_run(tmp_path: Path) -> None:
    path = tmp_path / "j" / "journal.jsonl"
    first = Journal(path)
    first.open()
    first.append({"event": "x", "n": 1})
    first.close()
    second = Journal(path)
    second.open()
    second.append({"event": "y"})
    second.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    headers = [r["meta"] for r in rows if "meta" in r]
    assert len(headers) == 2
    for h in headers:
        assert h["schema"] == "narwhal.journal" and h["schema_version"] == 1
        assert h["package"] == "narwhal-restart" and h["version"]
        assert h["source"] == source_digest() and h["source"].startswith("sha256:")
        assert "git" in h
    data = [r for r in rows if "meta" not in r]
    assert [d["run"] for d in data] == [first.run_id, second.run_id]
    assert all(d["schema"] == "narwhal.journal" for d in data)


def test_memory_only_journal_keeps_recent_rows() -> None:
    j = Journal(None)
    j.open()
    j.append({"event": "e"})
    j.close()
    assert j.recent[-1]["event"] == "e" and j.recent[-1]["run"] == j.run_id


async def test_rows_appended_on_a_loop_reach_the_writer_in_one_batch(tmp_path: Path) -> None:
    handed: list[bytes | None] = []

    class Recording(queue.SimpleQueue[bytes | None]):
        def put(self, item: bytes | None, block: bool = True, timeout: float | None = None) -> None:
            handed.append(item)
            super().put(item, block, timeout)

    journal = Journal(tmp_path / "j.jsonl")
    journal._queue = Recording()
    journal.open()
    handed.clear()  # the header
    for i in range(100):
        journal.append({"event": "request", "i": i})
    assert handed == []  # nothing handed over inside the loop iteration that appended them
    async with asyncio.timeout(20):
        path = tmp_path / "j.jsonl"  # the writer thread creates it
        while not path.exists() or len(path.read_text().splitlines()) < 101:  # noqa: ASYNC110 - the writer's file
            await asyncio.sleep(0.01)
    assert len(handed) == 1  # one wake-up of the writer for the batch
    journal.append({"event": "late"})  # a row pending at close is written too
    journal.close()
    rows = [json.loads(line) for line in (tmp_path / "j.jsonl").read_text().splitlines()]
    assert [r.get("i") for r in rows[1:101]] == list(range(100)) and rows[-1]["event"] == "late"


def test_a_planted_symlink_or_fifo_is_refused_and_nothing_outside_is_written(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_bytes(b"untouched\n")
    link = tmp_path / "state" / "journal.jsonl"
    link.parent.mkdir()
    link.symlink_to(victim)
    with pytest.raises(JournalRefused, match="symbolic link"):
        Journal(link).open()
    dangling = tmp_path / "state" / "dangling.jsonl"
    dangling.symlink_to(outside / "created-through-the-link")
    with pytest.raises(JournalRefused, match="symbolic link"):
        Journal(dangling).open()
    fifo = tmp_path / "state" / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(OSError):  # no reader: refused instead of blocking the start-up
        Journal(fifo).open()
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert victim.read_bytes() == b"untouched\n"
