"""Lease rules and the file backend (spec §3.1–3.3, §14 test_lease) with a fake clock and tmp files."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from router.clock import FakeClock
from router.ha.lease import (
    FileLeaseBackend,
    Lease,
    LeaseCorrupt,
    LeaseError,
    LeaseRecord,
    LeaseSettings,
    Unreadable,
    claim_rule,
    new_holder,
    record_from_doc,
    release_rule,
    renew_rule,
)

TTL, RENEW, MARGIN = 5.0, 1.0, 1.0


def _settings(path: Path, **kw: float) -> LeaseSettings:
    return LeaseSettings(
        path=str(path),
        router_id="r",
        ttl_s=kw.get("ttl", TTL),
        renew_interval_s=kw.get("renew", RENEW),
        safety_margin_s=kw.get("margin", MARGIN),
    )


def _lease(path: Path, clock: FakeClock, holder: str) -> Lease:
    return Lease(_settings(path), clock=clock, holder=holder)


def _doc(path: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads(path.read_text())
    return data


def _write_doc(path: Path, **over: object) -> None:
    doc: dict[str, object] = {
        "epoch": 1,
        "expires_at": 1_800_000_010.0,
        "holder": "other:1",
        "schema": "narwhal.router-lease",
        "schema_version": 1,
        "updated_at": 1_800_000_000.0,
    }
    doc.update(over)
    path.write_text(json.dumps(doc))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "shared" / "router.lease"


# -- constructor --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {"ttl": 0.0},
        {"ttl": -1.0},
        {"margin": -0.1},
        {"margin": 5.0},
        {"margin": 6.0},
        {"ttl": math.inf},
        {"ttl": math.nan},
        {"renew": math.nan},
        {"margin": math.inf},
        {"renew": 0.0},
        {"ttl": 2.0, "renew": 1.0, "margin": 1.0},  # ttl must exceed renew + margin
    ],
)
def test_settings_reject_bad_timing_before_touching_files(path: Path, kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        _settings(path, **kw)
    assert not path.parent.exists()


def test_empty_holder_and_router_id_are_rejected(path: Path, clock: FakeClock) -> None:
    with pytest.raises(ValueError):
        Lease(_settings(path), clock=clock, holder="")
    with pytest.raises(ValueError):
        LeaseSettings(path=str(path), router_id="")
    with pytest.raises(ValueError):
        LeaseSettings(path="", router_id="r")
    assert not path.parent.exists()


def test_holder_token_is_unique_per_process_object() -> None:
    a, b = new_holder("router-a"), new_holder("router-a")
    assert a != b and a.startswith("router-a:") and len(a.split(":")[-1]) == 32


# -- claim / competition ----------------------------------------------------------------------------


def test_first_claim_writes_epoch_one_with_sorted_keys(path: Path, clock: FakeClock) -> None:
    lease = _lease(path, clock, "a:1")
    assert lease.claim() and lease.valid() and lease.epoch == 1
    text = path.read_text()
    assert text.endswith("\n")
    doc = json.loads(text)
    assert list(doc) == sorted(doc)
    assert doc == {
        "epoch": 1,
        "expires_at": clock.wall() + TTL,
        "holder": "a:1",
        "schema": "narwhal.router-lease",
        "schema_version": 1,
        "updated_at": clock.wall(),
    }
    assert Path(str(path) + ".lock").exists()


def test_competing_holder_waits_for_expiry_then_takes_epoch_two(path: Path, clock: FakeClock) -> None:
    a, b = _lease(path, clock, "a:1"), _lease(path, clock, "b:2")
    assert a.claim()
    assert not b.claim() and not b.valid()
    clock.advance(TTL - 0.01)
    assert not b.claim()
    clock.advance(0.02)
    assert b.claim() and b.epoch == 2 and b.valid()
    # the old holder's renew fails and clears its ownership
    assert not a.renew()
    assert not a.owned and not a.valid()
    # its stale release does not disturb the new record
    before = path.read_bytes()
    a.owned = True  # even a holder that still believes it owns the lease
    a.release()
    assert path.read_bytes() == before
    assert _doc(path)["holder"] == "b:2"


def test_same_holder_reclaim_keeps_epoch_until_expiry(path: Path, clock: FakeClock) -> None:
    a = _lease(path, clock, "a:1")
    assert a.claim() and a.epoch == 1
    clock.advance(1.0)
    assert a.claim() and a.epoch == 1
    clock.advance(TTL + 1)
    assert a.claim() and a.epoch == 2


def test_local_validity_follows_the_monotonic_deadline(path: Path, clock: FakeClock) -> None:
    a = _lease(path, clock, "a:1")
    assert a.claim()
    clock.jump_wall(+3600)  # wall clock steps forward: local validity unaffected
    assert a.valid()
    clock.jump_wall(-7200)  # and backwards
    assert a.valid()
    clock.advance(TTL - MARGIN - 0.001)
    assert a.valid()
    clock.advance(0.002)
    assert not a.valid()  # ttl − margin elapsed on the monotonic clock


def test_renewal_extends_record_and_local_deadline(path: Path, clock: FakeClock) -> None:
    a = _lease(path, clock, "a:1")
    assert a.claim()
    clock.advance(3.0)
    assert a.renew()
    assert _doc(path)["expires_at"] == clock.wall() + TTL
    clock.advance(TTL - MARGIN - 0.01)
    assert a.valid()


def test_failed_renewal_keeps_old_deadline_and_leaves_no_temp_files(
    path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _lease(path, clock, "a:1")
    assert a.claim()
    deadline, before = a.deadline, path.read_bytes()
    clock.advance(1.0)

    def broken_replace(src: object, dst: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(LeaseError, match="Input/output error"):  # a local error: the caller retries
        a.renew()
    assert a.owned and a.deadline == deadline
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "router.lease",
        "router.lease.epoch",
        "router.lease.lock",
    ]


def test_full_disk_renewal_rewrites_the_record_in_place(
    path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _lease(path, clock, "a:1")
    assert a.claim()
    clock.advance(1.0)

    def full(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    assert a.renew() and a.valid()  # the lease survives a full disk
    assert FileLeaseBackend(path).read() == LeaseRecord.of(1, "a:1", clock.wall() + TTL, clock.wall())
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "router.lease",
        "router.lease.epoch",
        "router.lease.lock",
    ]


def test_release_expires_own_epoch(path: Path, clock: FakeClock) -> None:
    a = _lease(path, clock, "a:1")
    assert a.claim()
    clock.advance(1.0)
    a.release()
    assert not a.owned and not a.valid()
    doc = _doc(path)
    assert doc["epoch"] == 1 and doc["expires_at"] == clock.wall() == doc["updated_at"]
    b = _lease(path, clock, "b:2")
    assert b.claim() and b.epoch == 2  # immediately claimable, next epoch


def test_holder_rewrites_a_vanished_record(path: Path, clock: FakeClock) -> None:
    a = _lease(path, clock, "a:1")
    assert a.claim()
    path.unlink()
    clock.advance(1.0)
    assert a.renew() and a.owned and a.valid()
    assert _doc(path)["epoch"] == 1 and _doc(path)["holder"] == "a:1"
    assert a.recovered == "lease record missing: rewritten by the holder at epoch 1"


def test_holder_past_its_validity_does_not_recreate_a_vanished_record(path: Path, clock: FakeClock) -> None:
    a = _lease(path, clock, "a:1")
    assert a.claim()
    path.unlink()
    clock.advance(TTL)  # locally invalid: someone may have claimed meanwhile
    assert not a.renew() and not a.owned
    assert not path.exists()


def test_renewal_fails_when_epoch_changed(path: Path, clock: FakeClock) -> None:
    a = _lease(path, clock, "a:1")
    assert a.claim()
    _write_doc(path, epoch=7, holder="a:1", expires_at=clock.wall() + 10)
    assert not a.renew() and not a.owned


def test_renewal_fails_after_the_record_expired(path: Path, clock: FakeClock) -> None:
    a = _lease(path, clock, "a:1")
    assert a.claim()
    clock.advance(TTL + 0.5)  # e.g. SIGSTOP past the lease: nobody claimed, still lost
    assert not a.renew() and not a.owned


@pytest.mark.parametrize(
    "raw",
    [
        None,  # broken JSON
        {"epoch": True},
        {"epoch": 0},
        {"epoch": 1.0},
        {"holder": ""},
        {"holder": 3},
        {"expires_at": True},
        {"expires_at": "1800000010"},
        {"updated_at": None},
        {"extra": 1},
        {"schema": "narwhal.lease"},
        {"schema_version": 2},
        {"schema_version": True},
        "missing",
        "array",
    ],
)
def test_malformed_records_fail_closed(path: Path, clock: FakeClock, raw: object) -> None:
    path.parent.mkdir(parents=True)
    if raw is None:
        path.write_text('{"epoch": 1, "holder": ')
    elif raw == "missing":
        path.write_text(json.dumps({"epoch": 1, "holder": "x", "schema": "narwhal.router-lease"}))
    elif raw == "array":
        path.write_text("[]")
    else:
        assert isinstance(raw, dict)
        _write_doc(path, **raw)
    before = path.read_bytes()
    a = _lease(path, clock, "a:1")
    assert not a.claim()  # may still be a live holder's record: waited out, not claimed
    assert not a.owned and not a.valid() and a.problem
    assert path.read_bytes() == before
    with pytest.raises(LeaseCorrupt):
        FileLeaseBackend(path).read()
    clock.advance(TTL)  # a full TTL after the damage was first seen: recovered, epoch above all seen
    assert a.claim() and a.epoch == 1 and a.recovered.endswith("claimed epoch 1 above every epoch seen")


@pytest.mark.parametrize("field", ["expires_at", "updated_at"])
@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_timestamps_fail_read_claim_renew_without_rewriting(
    path: Path, clock: FakeClock, field: str, value: str
) -> None:
    a = _lease(path, clock, "a:1")
    assert a.claim()
    text = path.read_text()
    doc = json.loads(text)
    bad = text.replace(json.dumps(doc[field]), value, 1)
    path.write_text(bad)
    with pytest.raises(LeaseCorrupt):
        FileLeaseBackend(path).read()
    b = _lease(path, clock, "b:2")
    assert not b.claim() and b.problem  # the damaged record may be a live holder's
    assert path.read_text() == bad
    assert a.renew()  # the holder rewrites it with its own epoch
    assert FileLeaseBackend(path).read() == LeaseRecord.of(1, "a:1", clock.wall() + TTL, clock.wall())
    assert "rewritten by the holder at epoch 1" in a.recovered


def test_claim_write_failure_raises_and_keeps_previous_bytes(
    path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _lease(path, clock, "a:1")
    assert a.claim()
    a.release()
    before = path.read_bytes()

    def broken_replace(src: object, dst: object) -> None:
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", broken_replace)
    b = _lease(path, clock, "b:2")
    with pytest.raises(LeaseError, match=r"^cannot claim"):
        b.claim()
    assert not b.owned and path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "router.lease",
        "router.lease.epoch",
        "router.lease.lock",
    ]


def test_release_write_failure_still_drops_validity(
    path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _lease(path, clock, "a:1")
    assert a.claim()

    def broken_replace(src: object, dst: object) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(os, "replace", broken_replace)
    a.release()
    assert not a.owned and not a.valid()


def test_lock_busy_is_a_lease_error(path: Path, clock: FakeClock) -> None:
    import fcntl

    path.parent.mkdir(parents=True)
    with open(str(path) + ".lock", "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        backend = FileLeaseBackend(path, lock_timeout_s=0.0)
        with pytest.raises(LeaseError, match="busy"):
            Lease(_settings(path), backend=backend, clock=clock, holder="a:1").claim()


# -- pure rules -----------------------------------------------------------------------------------


def test_pure_rules() -> None:
    rec = LeaseRecord.of(3, "a", expires_at=110.0, updated_at=105.0)
    assert claim_rule(None, "a", 100.0, 5.0) == LeaseRecord.of(1, "a", 105.0, 100.0)
    assert claim_rule(rec, "b", 100.0, 5.0) is None
    assert claim_rule(rec, "a", 100.0, 5.0) == LeaseRecord.of(3, "a", 105.0, 100.0)
    assert claim_rule(rec, "b", 110.0, 5.0) == LeaseRecord.of(
        4, "b", 115.0, 110.0
    )  # expires_at == now: expired
    assert renew_rule(rec, "a", 3, 100.0, 5.0) == LeaseRecord.of(3, "a", 105.0, 100.0)
    assert renew_rule(rec, "a", 2, 100.0, 5.0) is None
    assert renew_rule(rec, "b", 3, 100.0, 5.0) is None
    assert renew_rule(rec, "a", 3, 110.0, 5.0) is None
    assert renew_rule(None, "a", 3, 100.0, 5.0) == LeaseRecord.of(3, "a", 105.0, 100.0)  # holder rewrites
    assert renew_rule(Unreadable("torn"), "a", 3, 100.0, 5.0) == LeaseRecord.of(3, "a", 105.0, 100.0)
    # epochs never go backwards: above the record's epoch and the floor (handoff epochs seen)
    assert claim_rule(rec, "b", 110.0, 5.0, floor=7) == LeaseRecord.of(8, "b", 115.0, 110.0)
    assert claim_rule(None, "b", 100.0, 5.0, floor=7) == LeaseRecord.of(8, "b", 105.0, 100.0)
    # a damaged or vanished record is claimable only from wait_until on
    assert claim_rule(Unreadable("torn"), "b", 100.0, 5.0, floor=3, wait_until=101.0) is None
    assert claim_rule(Unreadable("torn"), "b", 101.0, 5.0, floor=3, wait_until=101.0) == LeaseRecord.of(
        4, "b", 106.0, 101.0
    )
    assert claim_rule(None, "b", 100.0, 5.0, wait_until=101.0) is None
    assert release_rule(rec, "a", 3, 101.0) == LeaseRecord.of(3, "a", 101.0, 101.0)
    assert release_rule(rec, "a", 2, 101.0) is None
    assert release_rule(None, "a", 3, 101.0) is None


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"epoch": 0}, "epoch"),
        ({"epoch": True}, "epoch"),
        ({"holder": ""}, "holder"),
        ({"expires_at": float("nan")}, "expires_at"),
        ({"schema_version": 2}, "schema_version"),
        ({"schema": "narwhal.lease"}, "schema"),
        ({"stray": 1}, "stray"),
    ],
)
def test_a_malformed_record_is_refused_naming_the_field(change: dict[str, object], named: str) -> None:
    doc = LeaseRecord.of(3, "a:1", 110.0, 105.0).to_doc()
    assert record_from_doc(doc) == LeaseRecord.of(3, "a:1", 110.0, 105.0)  # round trip
    with pytest.raises(LeaseError, match=rf"^lease record invalid: {named}: "):
        record_from_doc(doc | change)
    missing = {k: v for k, v in doc.items() if k != "schema"}
    with pytest.raises(LeaseError, match="schema: Field required"):
        record_from_doc(missing)


def test_the_epoch_floor_outlives_a_deleted_record(path: Path, clock: FakeClock) -> None:
    """Every claim that raises the epoch writes ``<lease>.epoch`` first; a claim on a deleted
    record (by a router that never saw the last epoch) still goes above it."""
    floor = Path(str(path) + ".epoch")
    a = _lease(path, clock, "a:1")
    assert a.claim() and a.epoch == 1 and floor.read_text() == "1\n"
    clock.advance(TTL + 1)
    b = _lease(path, clock, "b:2")
    assert b.claim() and b.epoch == 2 and floor.read_text() == "2\n"
    assert b.renew() and floor.read_text() == "2\n"  # renewals do not write it
    path.unlink()
    clock.advance(TTL + 1)
    fresh = _lease(path, clock, "a:3")  # a new process: it saw epochs 1 only in its own files
    assert fresh.claim(floor=1) and fresh.epoch == 3
    assert floor.read_text() == "3\n" and _doc(path)["epoch"] == 3


def test_a_damaged_or_planted_epoch_floor_is_ignored_and_never_followed(
    path: Path, clock: FakeClock, tmp_path: Path
) -> None:
    floor = Path(str(path) + ".epoch")
    path.parent.mkdir(parents=True)
    floor.write_text("garbage")
    a = _lease(path, clock, "a:1")
    assert a.claim(floor=4) and a.epoch == 5 and floor.read_text() == "5\n"  # rewritten
    floor.unlink()
    victim = tmp_path / "victim"
    victim.write_text("7\n")
    floor.symlink_to(victim)
    clock.advance(TTL + 1)
    b = _lease(path, clock, "b:2")
    assert b.claim() and b.epoch == 6  # the link is not read (7 would give 8) nor written through
    assert victim.read_text() == "7\n" and floor.is_symlink()
