"""Which handoff a standby takes over with: its last poll, or the holder's shared copy."""

from __future__ import annotations

import json
from pathlib import Path

from router.ha.handoff import Handoff, validate
from router.ha.lease import LeaseRecord
from router.ha.standby import freshest


def _doc(epoch: int, holder: str, at: float) -> Handoff:
    raw = json.loads((Path(__file__).parent / "fixtures" / "handoff_initial.json").read_text())
    raw.update(epoch=epoch, holder=holder, at=at)
    return validate(raw)


def _lease(epoch: int, holder: str) -> LeaseRecord:
    return LeaseRecord.of(epoch=epoch, holder=holder, expires_at=10.0, updated_at=5.0)


def test_newer_shared_copy_of_the_last_holder_wins() -> None:
    polled, shared = _doc(1, "a:1", 100.0), _doc(1, "a:1", 101.0)
    assert freshest(polled, shared, _lease(1, "a:1")) is shared
    assert freshest(None, shared, _lease(1, "a:1")) is shared


def test_older_shared_copy_loses_to_the_poll() -> None:
    polled, shared = _doc(1, "a:1", 102.0), _doc(1, "a:1", 101.0)
    assert freshest(polled, shared, _lease(1, "a:1")) is polled


def test_shared_copy_of_another_holder_or_epoch_is_ignored() -> None:
    polled = _doc(1, "a:1", 100.0)
    assert freshest(polled, _doc(1, "x:9", 200.0), _lease(1, "a:1")) is polled
    assert freshest(polled, _doc(0, "a:1", 200.0), _lease(1, "a:1")) is polled
    assert freshest(polled, _doc(1, "a:1", 200.0), None) is polled
    assert freshest(polled, None, _lease(1, "a:1")) is polled
