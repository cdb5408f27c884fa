"""Which handoff a standby takes over with: its last poll, or the holder's shared copy."""

from __future__ import annotations

import json
from pathlib import Path

from router.ha.handoff import Handoff, validate
from router.ha.standby import freshest


def _doc(epoch: int, holder: str, at: float) -> Handoff:
    raw = json.loads((Path(__file__).parent / "fixtures" / "handoff_initial.json").read_text())
    raw.update(epoch=epoch, holder=holder, at=at)
    return validate(raw)


def test_newer_shared_copy_wins() -> None:
    polled, shared = _doc(1, "a:1", 100.0), _doc(1, "a:1", 101.0)
    assert freshest(polled, shared) is shared
    assert freshest(None, shared) is shared


def test_older_shared_copy_loses_to_the_poll() -> None:
    polled, shared = _doc(1, "a:1", 102.0), _doc(1, "a:1", 101.0)
    assert freshest(polled, shared) is polled
    assert freshest(polled, None) is polled


def test_higher_epoch_wins_whatever_the_times() -> None:
    # a corrupt or vanished lease record does not make the holder's shared copy unusable
    polled = _doc(1, "a:1", 200.0)
    newer_holder = _doc(2, "x:9", 150.0)
    assert freshest(polled, newer_holder) is newer_holder
    assert freshest(newer_holder, polled) is newer_holder
