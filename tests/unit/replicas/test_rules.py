"""Pure active-active rules: acknowledgement, stop safety, placement validity, coalescing."""

from __future__ import annotations

import math

import orjson
import pytest

from router.replicas import rules
from router.replicas.member import MemberError, MemberRecord, ResidentWork, decode_member, residents_from


def rec(
    rid: str, version: int, resident: dict[str, tuple[int, int]] | None = None, at: float = 100.0
) -> MemberRecord:
    return MemberRecord(
        replica_id=rid,
        control_url=f"http://{rid}.test",
        applied_version=version,
        resident=residents_from(resident or {}),
        updated_at=at,
    )


def members(*records: MemberRecord) -> dict[str, MemberRecord]:
    return {r.replica_id: r for r in records}


# -- membership record ------------------------------------------------------------------------


def test_member_record_round_trips_and_drops_zero_rows() -> None:
    r = rec("r1", 7, {"e0": (1, 2), "e1": (0, 0)})
    assert r.resident == {"e0": ResidentWork(prefill=1, decode=2)}
    back = decode_member(r.encode(), key_id="r1")
    assert back == r and back.dump()["schema"] == "narwhal.replica"
    assert back.resident_on("e1") == ResidentWork()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{", "not valid JSON"),
        (b"[]", "must be a JSON object"),
        (b'{"schema":"narwhal.handoff","schema_version":1}', "schema 'narwhal.handoff'"),
        (b'{"schema":"narwhal.replica","schema_version":2}', "schema_version 2"),
        (b'{"schema":"narwhal.replica","schema_version":true}', "schema_version True"),
    ],
)
def test_member_record_refuses_foreign_or_torn_values(raw: bytes, message: str) -> None:
    with pytest.raises(MemberError, match=message):
        decode_member(raw)


@pytest.mark.parametrize(
    ("patch", "where"),
    [
        ({"applied_version": -1}, "applied_version"),
        ({"applied_version": True}, "applied_version"),
        ({"updated_at": "soon"}, "updated_at"),
        ({"updated_at": True}, "updated_at"),
        ({"extra": 1}, "extra"),
        ({"resident": {"e0": {"prefill": -1, "decode": 0}}}, "resident.e0.prefill"),
        ({"replica_id": ""}, "replica_id"),
    ],
)
def test_member_record_is_strict(patch: dict[str, object], where: str) -> None:
    doc = {**rec("r1", 1).dump(), **patch}
    with pytest.raises(MemberError, match=where):
        decode_member(orjson.dumps(doc))


def test_member_record_under_another_replicas_key_is_refused() -> None:
    with pytest.raises(MemberError, match="stored under key 'r2'"):
        decode_member(rec("r1", 1).encode(), key_id="r2")


# -- acknowledgement ------------------------------------------------------------------------------


def test_drain_is_acknowledged_only_when_every_live_replica_applied_it() -> None:
    live = members(rec("holder", 5), rec("r1", 5), rec("r2", 4))
    state = rules.ack_state(5, live, "holder")
    assert not state.acknowledged and state.waiting == ("r2",)
    assert state.describe() == "lifecycle version 5 not yet applied by replica(s): r2 (applied 4)"
    live["r2"] = rec("r2", 6)
    assert rules.ack_state(5, live, "holder").acknowledged


def test_an_expired_replica_key_stops_counting_and_the_holder_needs_no_ack_from_itself() -> None:
    live = members(rec("holder", 1), rec("r1", 3), rec("dead", 0))
    assert rules.ack_state(3, live, "holder").waiting == ("dead",)
    del live["dead"]  # the store deleted the key with its lease
    assert rules.ack_state(3, live, "holder").acknowledged
    assert rules.ack_state(3, {}, "holder").acknowledged  # a lone holder


# -- ready_to_stop across replicas ---------------------------------------------------------------------


def test_ready_to_stop_needs_the_holder_and_every_live_replica_clear() -> None:
    live = members(rec("h", 9), rec("r1", 9, {"e0": (0, 1)}), rec("r2", 9))
    assert rules.remote_resident("e0", live, "h") == ResidentWork(prefill=0, decode=1)
    assert not rules.ready_to_stop(True, "e0", 8, live, "h")  # a stream placed by r1 still runs
    assert rules.ready_to_stop(True, "e1", 8, live, "h")  # other engines are unaffected
    live["r1"] = rec("r1", 9)
    assert rules.ready_to_stop(True, "e0", 8, live, "h")
    assert not rules.ready_to_stop(False, "e0", 8, live, "h")  # the holder's own rule still applies


def test_ready_to_stop_waits_for_a_replica_that_has_not_applied_the_hold() -> None:
    live = members(rec("h", 9), rec("r1", 7))  # r1 reports nothing resident, but from before the hold
    assert not rules.replicas_clear("e0", 8, live, "h")
    del live["r1"]  # killed: its key expired
    assert rules.replicas_clear("e0", 8, live, "h")


# -- placement validity of a replica whose key cannot be renewed ----------------------------------


def test_a_replica_stops_placing_before_its_key_can_expire() -> None:
    v = rules.PlacementValidity(ttl_s=3.0, safety_margin_s=1.0)
    assert not v.can_place(0.0)  # never granted
    v.renewed(10.0)  # keep-alive sent at t=10 (monotonic read before the call)
    assert v.can_place(11.99) and v.remaining(11.0) == pytest.approx(1.0)
    assert not v.can_place(12.0)  # 10 + 3 - 1: the store may expire the key at >= 13
    v.renewed(11.5)
    assert v.can_place(13.4) and not v.can_place(13.5)
    v.renewed(9.0)  # a late answer to an older keep-alive never shortens nor extends wrongly
    assert v.can_place(13.4)
    v.lost()
    assert not v.can_place(11.6)


@pytest.mark.parametrize(("ttl", "margin"), [(0.0, 0.0), (math.inf, 0.0), (2.0, 2.0), (2.0, -0.1)])
def test_placement_validity_refuses_unsafe_timing(ttl: float, margin: float) -> None:
    with pytest.raises(ValueError):
        rules.PlacementValidity(ttl_s=ttl, safety_margin_s=margin)


# -- what a replica may report -----------------------------------------------------------------------


def test_applied_version_is_reported_only_once_no_leg_is_still_on_its_way_to_a_held_engine() -> None:
    assert rules.version_to_report(5, 4, {"e0": 1, "e1": 0}, ["e0"]) == 4  # a prefill still going to e0
    assert rules.version_to_report(5, 4, {"e0": 0, "e1": 3}, ["e0"]) == 5  # e1 still serves: fine
    assert rules.version_to_report(3, 4, {}, []) == 4  # never backwards


# -- coalescing ------------------------------------------------------------------------------------------


def test_coalescer_publishes_urgent_changes_at_once_and_batches_the_rest() -> None:
    c = rules.Coalescer(min_interval_s=0.5)
    first = rec("r1", 1)
    assert c.due(first, 10.0) == 0.0  # nothing published yet
    c.mark_published(first, 10.0)
    assert c.due(rec("r1", 1, at=11.0), 10.1) is None  # only updated_at differs: nothing to say
    busy = rec("r1", 1, {"e1": (1, 0)})
    assert c.due(busy, 10.1) == pytest.approx(0.4)  # serving engine: coalesced
    assert c.due(busy, 10.7) == 0.0
    assert c.due(rec("r1", 2), 10.1) == 0.0  # a new applied version: a drain is waiting
    assert c.due(busy, 10.1, urgent_engines=["e1"]) == 0.0  # held engine: ready_to_stop is waiting
