"""State file (spec §2.3, §14 test_persistence): atomic write, tolerant load, refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from router.ha import statefile
from router.ha.handoff import HandoffError, validate
from tests.unit.ha.helpers import core, fixture, handover


def _listing(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


def test_atomic_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "state.json"
    doc = validate(fixture("handoff_after_resume.json"))
    statefile.write(path, doc)
    assert path.read_text().endswith("\n")
    loaded = statefile.load(path)
    assert loaded is not None and loaded.dump() == doc.dump()
    assert _listing(path) == ["state.json"]


def test_failed_replace_keeps_previous_bytes_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.json"
    statefile.write(path, validate(fixture("handoff_initial.json")))
    before = path.read_bytes()

    def broken(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError):
        statefile.write(path, validate(fixture("handoff_after_resume.json")))
    assert path.read_bytes() == before
    assert _listing(path) == ["state.json"]


def test_write_refuses_an_invalid_document(tmp_path: Path) -> None:
    doc = validate(fixture("handoff_initial.json"))
    bad = doc.model_copy(update={"epoch": -3})  # model_copy skips validation; write re-validates
    with pytest.raises(HandoffError):
        statefile.write(tmp_path / "state.json", bad)
    assert not (tmp_path / "state.json").exists()


@pytest.mark.parametrize(
    "content",
    [None, b"", b'{"schema": "narwhal.handoff", "schema_version": 1, "at": 17', b"\xff\xfe\x00garbage"],
    ids=["missing", "empty", "truncated", "bad-utf8"],
)
def test_unusable_file_loads_as_none(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "state.json"
    if content is not None:
        path.write_bytes(content)
    assert statefile.load(path) is None
    assert statefile.load_reason(path) == (None, "no handoff file")


def test_parseable_but_invalid_file_raises(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    raw = fixture("handoff_initial.json")
    raw["epoch"] = True
    path.write_text(json.dumps(raw))
    with pytest.raises(HandoffError):
        statefile.load(path)
    doc, why = statefile.load_reason(path)
    assert doc is None and why.startswith("handoff file invalid:")


def test_built_document_survives_the_file(tmp_path: Path) -> None:
    c = core()
    c.counters.finish("served")
    path = tmp_path / "state.json"
    statefile.write(path, handover(c).build())
    loaded = statefile.load(path)
    assert loaded is not None and loaded.counters["served"] == 1
