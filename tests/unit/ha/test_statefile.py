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
    ("content", "kind", "reason"),
    [
        (None, "missing", "no handoff file"),
        (b"", "empty", "handoff file empty: "),
        (b"  \n", "empty", "handoff file empty: "),
        (b'{"schema": "narwhal.handoff", "schema_version": 1, "at": 17', "torn", "handoff file torn: "),
        (b"\xff\xfe\x00garbage", "not_utf8", "handoff file not UTF-8: "),
    ],
    ids=["missing", "empty", "blank", "truncated", "bad-utf8"],
)
def test_unusable_file_is_reported_as_what_it_is(
    tmp_path: Path, content: bytes | None, kind: str, reason: str
) -> None:
    path = tmp_path / "state.json"
    if content is not None:
        path.write_bytes(content)
    assert statefile.load(path) is None
    found = statefile.read(path)
    assert found.doc is None and found.kind == kind and found.reason.startswith(reason)
    assert statefile.load_reason(path) == (None, found.reason)


def test_symlinked_state_file_is_refused_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "passwd"
    victim.write_text("root:x:0:0:root:/root:/bin/bash\n")
    state = tmp_path / "state" / "state.json"
    state.parent.mkdir()
    state.symlink_to(victim)
    found = statefile.read(state)
    assert found.kind == "symlink" and "symbolic link" in found.reason
    with pytest.raises(OSError, match="symbolic link"):
        statefile.write(state, validate(fixture("handoff_initial.json")))
    assert victim.read_text() == "root:x:0:0:root:/root:/bin/bash\n" and state.is_symlink()
    with pytest.raises(OSError, match="symbolic link"):
        statefile.write_bytes(state.with_name("state.json.rejected"), b"x") if (
            state.with_name("state.json.rejected").symlink_to(victim) is None
        ) else None
    assert victim.read_text().startswith("root:") and sorted(p.name for p in outside.iterdir()) == ["passwd"]
    assert sorted(p.name for p in state.parent.iterdir()) == ["state.json", "state.json.rejected"]


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
