"""A follower replica applies the holder's lifecycle state to its placement (pure, fake clock)."""

from __future__ import annotations

from typing import Any

from router.clock import FakeClock
from router.config import FleetConfig, parse_fleet
from router.core import RouterCore
from router.ha import transfer
from router.ha.handoff import Handoff
from router.journal import Journal
from router.lifecycle.machine import Verdict
from router.lifecycle.service import LifecycleService
from router.replicas.follow import Follower, HoldVersions, readmitted_between
from router.replicas.member import MemberRecord, residents_from
from router.replicas.picture import ReplicaSet


def fleet(n: int = 3, policy: str = "individual", model: str = "fake") -> FleetConfig:
    data: dict[str, Any] = {
        "model": model,
        "engines": [{"iid": f"e{i}", "url": f"http://e{i}.test"} for i in range(n)],
        "recovery": {"engine_restart_policy": policy},
    }
    return parse_fleet(data)


def router(
    config: FleetConfig | None = None, clock: FakeClock | None = None
) -> tuple[RouterCore, LifecycleService]:
    core = RouterCore(config=config or fleet(), journal=Journal(None), clock=clock or FakeClock())
    return core, LifecycleService(core)


class Pair:
    """A holder and one follower on one fake clock; ``commit`` = the holder's store write."""

    def __init__(self, config: FleetConfig | None = None) -> None:
        self.clock = FakeClock()
        self.holder, self.hs = router(config, self.clock)
        self.core, self.fs = router(config, self.clock)
        self.replicas = ReplicaSet(self.core.scheduler, self.clock, "r1", "http://r1.test")
        self.follower = Follower(self.core, self.fs.machine, holds=self.replicas.holds)
        self.version = 0

    def commit(self) -> Handoff:
        self.version += 1
        doc = transfer.build(self.holder, self.hs)
        result = self.follower.apply(self.version, doc)
        assert result.applied, result.reason
        self.replicas.version = self.follower.version
        return doc

    def drain(self, iid: str, start: float = 1000.0) -> None:
        self.hs.machine.begin([iid], False, 300)
        self.hs.machine.record_old_identity(iid, start)


def picks(core: RouterCore, n: int = 12) -> set[str]:
    out = set()
    for _ in range(n):
        e = core.scheduler.pick("prefill")
        if e is not None:
            out.add(e.iid)
    return out


def test_a_drain_committed_by_the_holder_leaves_the_followers_placement() -> None:
    p = Pair()
    p.commit()
    assert picks(p.core) == {"e0", "e1", "e2"}
    p.drain("e0")
    p.commit()
    assert not p.core.scheduler.accepts_new("e0")
    assert picks(p.core) == {"e1", "e2"}
    assert p.fs.machine.state("e0") == "drained"
    assert p.core.ready()  # e1 and e2 still serve
    assert p.core.scheduler.fleet_hold == ""


def test_a_wave_drain_holds_every_engine_on_the_follower() -> None:
    p = Pair()
    p.hs.machine.begin([], True, 300)
    p.commit()
    assert p.core.scheduler.fleet_hold.startswith("whole-wave drain wave-")
    assert p.core.scheduler.eligible() == [] and picks(p.core) == set()


def test_validating_stays_validating_on_a_follower_and_readmission_returns_the_engine() -> None:
    p = Pair()
    p.drain("e1")
    p.commit()
    p.hs.machine.mark_validating(["e1"], False)
    p.commit()
    assert p.fs.machine.state("e1") == "validating"  # not "interrupted": the holder is still at it
    assert not p.core.scheduler.accepts_new("e1")
    p.core.scheduler.eject("e1", "transport")  # local breaker evidence from before the restart
    p.hs.machine.complete_validation({"e1": Verdict(checks=["health"], process_start=2000.0)})
    p.commit()
    assert p.fs.machine.state("e1") == "active"
    assert p.core.scheduler.accepts_new("e1") and "e1" not in p.core.scheduler.ejected
    assert p.fs.machine.process_starts["e1"] == 2000.0


def test_counters_and_breaker_evidence_stay_local() -> None:
    p = Pair()
    p.holder.counters.offer()
    p.core.scheduler.eject("e2", "transport")
    p.holder.scheduler.eject("e0", "liveness")
    p.commit()
    assert "e0" not in p.core.scheduler.ejected and "e2" in p.core.scheduler.ejected
    assert p.core.counters.snapshot()["offered"] == 0


def test_versions_only_move_forward_and_a_foreign_state_blocks_placement() -> None:
    p = Pair()
    doc = p.commit()
    assert not p.follower.apply(1, doc).applied  # the same version again
    foreign = transfer.build(*router(fleet(model="other")))
    result = p.follower.apply(7, foreign)
    assert not result.applied and "is not the configured model" in result.reason
    assert p.follower.blocked.startswith("cannot follow the holder's lifecycle state: handoff model")
    assert p.follower.version == 1
    p.drain("e0")
    p.commit()  # the holder's next good state clears the block
    assert p.follower.blocked == "" and not p.core.scheduler.accepts_new("e0")


def test_hold_versions_remember_the_first_version_of_each_hold() -> None:
    holds = HoldVersions()
    p = Pair()
    p.drain("e0")
    holds.observe(transfer.build(p.holder, p.hs).lifecycle, 4)
    holds.observe(transfer.build(p.holder, p.hs).lifecycle, 9)
    assert holds.of("e0", 0) == 4 and holds.of("e1", 99) == 99
    p.hs.machine.mark_validating(["e0"], False)
    p.hs.machine.complete_validation({"e0": Verdict(process_start=2000.0)})
    section = transfer.build(p.holder, p.hs).lifecycle
    holds.observe(section, 10)
    assert holds.of("e0", 11) == 11  # readmitted: a later drain gets its own version
    assert readmitted_between(None, section) == ["e0"]
    assert readmitted_between(section, section) == []


def member(rid: str, version: int, resident: dict[str, tuple[int, int]] | None = None) -> MemberRecord:
    return MemberRecord(
        replica_id=rid,
        control_url=f"http://{rid}.test",
        applied_version=version,
        resident=residents_from(resident or {}),
        updated_at=1_800_000_000.0,
    )


def holder_with_replica_set() -> tuple[LifecycleService, ReplicaSet]:
    """The holder's lifecycle over its replica set (resident work and the stop gate: assembly's wiring)."""
    core = RouterCore(config=fleet(), journal=Journal(None), clock=FakeClock())
    rs = ReplicaSet(core.scheduler, core.clock, "h", "http://h.test")
    return LifecycleService(core, replicas=rs), rs


def test_ready_to_stop_on_the_holder_waits_for_a_stream_placed_by_another_replica() -> None:
    service, rs = holder_with_replica_set()
    rs.member_put(member("r1", 0, {"e0": (0, 1)}))  # r1 streams from e0
    service.machine.begin(["e0"], False, 300)
    service.machine.record_old_identity("e0", 1000.0)
    rs.version = 3
    rs.holds.observe(service.snapshot(), 3)
    doc = service.document()
    assert doc.engines["e0"].state == "draining"  # r1's stream is resident work too
    assert doc.engines["e0"].resident.decode == 1 and not doc.engines["e0"].ready_to_stop
    assert rs.ack(3).waiting == ("r1",)
    rs.member_put(member("r1", 3, {"e0": (0, 1)}))  # r1 applied the drain, the stream runs on
    assert rs.ack(3).acknowledged and not service.document().engines["e0"].ready_to_stop
    rs.member_put(member("r1", 3))  # the stream ended
    doc = service.document()
    assert doc.engines["e0"].state == "drained" and doc.engines["e0"].ready_to_stop
    section = doc.to_json()["replicas"]
    assert [m["id"] for m in section["members"]] == ["h", "r1"]
    assert section["self_id"] == "h" and section["members"][1]["applied_version"] == 3


def test_a_killed_replica_stops_counting_once_its_key_expires() -> None:
    service, rs = holder_with_replica_set()
    rs.member_put(member("dead", 5, {"e0": (1, 0)}))
    service.machine.begin(["e0"], False, 300)
    service.machine.record_old_identity("e0", 1000.0)
    rs.holds.observe(service.snapshot(), 5)
    assert not service.document().engines["e0"].ready_to_stop
    rs.member_gone("dead")
    assert service.document().engines["e0"].ready_to_stop


def test_the_peer_document_is_unchanged_without_replicas() -> None:
    _, service = router()
    body = service.document().to_json()
    assert "replicas" not in body
    assert set(body) == {
        "schema", "schema_version", "router", "wave", "engines", "events",
        "engine_restart_policy", "process_starts", "error",
    }  # fmt: skip


def test_a_takeover_adopts_the_lifecycle_but_keeps_this_replicas_counters_and_evidence() -> None:
    from router.ha.etcd_client import EtcdClient
    from router.replicas.service import ReplicaService, ReplicaSettings

    p = Pair()
    p.drain("e0")
    p.hs.machine.mark_validating(["e0"], False)  # the holder dies while validating e0
    p.holder.counters.offer()
    p.holder.scheduler.eject("e2", "liveness")
    doc = transfer.build(p.holder, p.hs)
    settings = ReplicaSettings(prefix="/narwhal/fake/", replica_id="r1", control_url="http://r1.test")
    service = ReplicaService(p.core, p.fs, EtcdClient("http://127.0.0.1:9"), settings)
    p.core.counters.offer()
    p.core.counters.offer()
    applied, why = service.adopt(doc)
    assert applied, why
    assert p.fs.machine.state("e0") == "blocked"  # a replacement cannot finish the validation
    assert p.core.counters.snapshot()["offered"] == 2  # this replica's own counters
    assert "e2" not in p.core.scheduler.ejected  # the dead holder's breaker evidence stays its own
    assert p.core.identities_ready  # it served on them as a follower; the monitor re-checks them
    foreign = transfer.build(router(fleet(model="other"))[0], None)
    assert service.adopt(foreign)[0] is False
