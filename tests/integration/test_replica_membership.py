"""Active-active replica I/O on a real three-member etcd cluster (replicas in-process, real keys).

The holder's commits are made the way the HA backend makes them: a put of ``<prefix>handoff``
carrying the holder's ``narwhal.handoff`` document. What is asserted is what the replicas do with
them: membership keys on their own leases, follow-by-watch, the drain's acknowledgement wait, and
``ready_to_stop`` across replicas (including a replica whose key expires).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest

from router.clock import SystemClock
from router.config import FleetConfig, parse_fleet
from router.core import RouterCore
from router.ha import transfer
from router.ha.etcd_client import EtcdClient
from router.journal import Journal
from router.lifecycle.service import LifecycleService
from router.replicas.member import decode_member
from router.replicas.mode import ActiveActive
from router.replicas.service import NO_STATE, ReplicaService, ReplicaSettings, replica_set
from tests.support.etcd import EtcdCluster

pytestmark = pytest.mark.integration


def fleet() -> FleetConfig:
    return parse_fleet(
        {"model": "fake", "engines": [{"iid": f"e{i}", "url": f"http://127.0.0.1:9/{i}"} for i in range(3)]}
    )


@dataclass
class Replica:
    core: RouterCore
    lifecycle: LifecycleService
    service: ReplicaService
    client: EtcdClient


async def start_replica(endpoints: str, prefix: str, rid: str, holder: bool = False) -> Replica:
    core = RouterCore(config=fleet(), journal=Journal(None), clock=SystemClock())
    if not holder:
        core.control.standby = True  # a follower: does not control the fleet
    client = EtcdClient(endpoints, timeout_s=1.0, retry_s=5.0)
    settings = ReplicaSettings(
        prefix=prefix, replica_id=rid, control_url=f"http://{rid}.test", ttl_s=2.0, ack_timeout_s=5.0
    )
    # assembly's wiring (router/assemble.py): the replica set, the lifecycle over it, the mode
    replicas = replica_set(core, settings)
    lifecycle = LifecycleService(core, replicas=replicas)
    service = ReplicaService(core, lifecycle, client, settings, replicas=replicas)
    core.mode = ActiveActive(service)
    await service.start()
    return Replica(core, lifecycle, service, client)


async def wait_for(predicate: Callable[[], bool], what: str, within: float = 20.0) -> None:
    give_up = time.monotonic() + within
    while not predicate():
        if time.monotonic() > give_up:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@pytest.fixture
async def trio(etcd_cluster: EtcdCluster, etcd_prefix: str) -> AsyncIterator[list[Replica]]:
    replicas = [
        await start_replica(etcd_cluster.endpoints, etcd_prefix, "h", holder=True),
        await start_replica(etcd_cluster.endpoints, etcd_prefix, "r1"),
        await start_replica(etcd_cluster.endpoints, etcd_prefix, "r2"),
    ]
    try:
        await wait_for(lambda: all(len(r.service.replicas.members) == 3 for r in replicas), "3 members")
        yield replicas
    finally:
        for r in replicas:
            await r.service.stop()
            await r.client.aclose()


async def commit(holder: Replica) -> int:
    """The holder's commit of its state (what the HA backend's fenced write puts)."""
    doc = transfer.build(holder.core, holder.lifecycle)
    key = holder.service.settings.handoff_key
    return await holder.client.put(key, doc.model_dump_json(by_alias=True).encode())


async def test_members_register_followers_apply_commits_by_watch_and_drains_wait_for_every_replica(
    trio: list[Replica],
) -> None:
    h, r1, r2 = trio
    assert r1.service.placement_reason() == NO_STATE and not r1.core.ready()
    version = await commit(h)
    await wait_for(lambda: r1.core.ready() and r2.core.ready(), "followers ready after the first commit")
    assert r1.service.replicas.version == version

    # the drain: machine + commit + acknowledgement, as the lifecycle POST does it
    h.lifecycle.machine.begin(["e0"], False, 300)
    h.lifecycle.machine.record_old_identity("e0", 1000.0)
    started = time.monotonic()
    drained_at = await commit(h)
    assert await h.service.acknowledge() == ""
    elapsed = time.monotonic() - started
    for r in (r1, r2):
        assert not r.core.scheduler.accepts_new("e0")
        assert r.lifecycle.machine.state("e0") == "drained"
        assert h.service.replicas.members[r.service.settings.replica_id].applied_version >= drained_at
    assert elapsed < 5.0  # acknowledged by the watch, not by the timeout
    raw = await h.client.get(r1.service.settings.member_key)
    assert raw is not None and raw.lease == r1.service.lease_id
    assert decode_member(raw.value, "r1").applied_version >= drained_at


async def test_ready_to_stop_waits_for_work_a_follower_placed_and_for_a_dead_follower_key(
    trio: list[Replica],
) -> None:
    h, r1, r2 = trio
    await commit(h)
    await wait_for(lambda: r1.core.ready() and r2.core.ready(), "followers ready")
    r1.core.scheduler.engines["e1"].resident_decode += 1  # a long stream placed by r1
    r2.core.scheduler.engines["e1"].resident_prefill += 1  # r2 is killed with a leg on e1
    h.lifecycle.machine.begin(["e1"], False, 300)
    h.lifecycle.machine.record_old_identity("e1", 1000.0)
    await commit(h)
    await wait_for(lambda: h.lifecycle.document().engines["e1"].resident.decode == 1, "r1's stream seen")
    assert h.lifecycle.document().engines["e1"].ready_to_stop is False
    # r2 stops renewing its key (as a SIGKILLed process would) with its leg still counted
    for task in r2.service._tasks:
        task.cancel()
    r1.core.scheduler.engines["e1"].resident_decode -= 1  # r1's stream ends
    killed = time.monotonic()
    await wait_for(lambda: h.lifecycle.document().engines["e1"].ready_to_stop, "ready_to_stop", 15)
    waited = time.monotonic() - killed
    assert "r2" not in h.service.replicas.members
    assert waited >= 1.0  # it took r2's key expiring, not r1's stream ending alone
    doc = h.lifecycle.document().to_json()
    assert [m["id"] for m in doc["replicas"]["members"]] == ["h", "r1"]


async def test_a_replica_that_cannot_renew_stops_placing_before_its_key_expires(trio: list[Replica]) -> None:
    h, r1, _ = trio
    await commit(h)
    await wait_for(lambda: r1.core.ready(), "r1 ready")
    for task in r1.service._tasks:
        if task.get_name() == "narwhal-replica-keepalive":
            task.cancel()
    await wait_for(lambda: not r1.core.ready(), "r1 stops placing", 10)
    stopped = time.monotonic()
    assert r1.core.prefill_hold_reason().startswith("replica membership key not renewed")
    await wait_for(lambda: "r1" not in h.service.replicas.members, "r1's key expires", 10)
    assert time.monotonic() - stopped > 0.2  # placing stopped before the key could expire
