"""Active-active serving against real processes: a three-member etcd cluster, three router
replicas (``--ha-mode active-active``), simulated engines, client load over all replicas, SIGKILL.

What a user sees is asserted: /ready and ``router.controls_fleet`` of each replica, the drain's
status code, what the engines themselves received (``/sim/stats``), ``ready_to_stop``, client
failures per replica, and the epoch after a takeover.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.integration.active_active_support import (
    LEASE_TTL,
    RENEW,
    REPLICA_TTL,
    LongStream,
    holder_of,
    legs,
    lifecycle,
    replica_id,
    replica_load,
    replica_resident,
    start_replica,
    wait_serving,
)
from tests.integration.conftest import Temporal
from tests.integration.restart_support import new_fleet, plan, start, supervisor_restarts, until
from tests.support.etcd import EtcdCluster
from tests.support.fleet import process_start, start_sims, start_supervisor
from tests.support.lifecycle import wait_for
from tests.support.procs import proc_group

pytestmark = pytest.mark.integration
NOT_CONTROLLING = "this router does not control the fleet"


def stream_engine(holder_doc_resident: dict[str, dict[str, int]]) -> str:
    busy = [iid for iid, r in holder_doc_resident.items() if r.get("decode", 0) > 0]
    return busy[0] if len(busy) == 1 else ""


def test_every_replica_serves_one_controls_and_a_drain_holds_on_every_replica(
    tmp_path: Path, etcd_cluster: EtcdCluster, etcd_prefix: str
) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3, itl_ms=4)  # the long stream: 6000 tokens ≈ 24 s
        names = ["r0", "r1", "r2"]
        replicas = [
            start_replica(group, tmp_path, sims, etcd_cluster.endpoints, etcd_prefix, n) for n in names
        ]
        holder = wait_serving(replicas)
        others = [r for r in replicas if r is not holder]
        for r in others:  # followers: serve, do not control, name the holder
            doc = lifecycle(r)
            assert doc["router"]["controls_fleet"] is False
            assert doc["replicas"]["holder_url"] == holder.url
            post = r.post("/narwhal/lifecycle/drain", {"engines": ["e0"]})
            assert post.status_code == 503 and post.json()["error"] == NOT_CONTROLLING
            assert post.json()["replicas"]["holder_url"] == holder.url
        assert sorted(m["id"] for m in lifecycle(holder)["replicas"]["members"]) == names

        # a long stream placed by a non-holder: its decode leg is the only resident work
        follower = others[0]
        fid = replica_id(follower)
        long = LongStream(follower.url, max_tokens=6000).start()
        target = wait_for("the long stream's engine", lambda: stream_engine(replica_resident(holder, fid)))
        sim = next(s for s in sims if s.iid == target)

        with replica_load([r.url for r in replicas]) as load:
            wait_for("load on every replica", lambda: all(load.ok.get(r.url, 0) >= 5 for r in replicas))
            drain = holder.post("/narwhal/lifecycle/drain", {"engines": [target], "deadline_s": 300})
            assert drain.status_code == 200, drain.text
            received = legs(sim)
            for r in replicas:  # every replica holds it out of placement
                assert lifecycle(r)["engines"][target]["accepts_new"] is False
            served = load.total_ok()
            wait_for("60 more requests served", lambda: load.total_ok() >= served + 60, timeout=60)
            assert legs(sim) == received  # not one new leg reached the drained engine
            doc = lifecycle(holder)
            assert not long.done.is_set(), "the long stream ended too early for this check"
            assert doc["engines"][target]["ready_to_stop"] is False  # the follower's stream runs on
            assert doc["engines"][target]["resident"]["decode"] >= 1
            long.done.wait(120)
            assert long.status == 200 and "[DONE]" in long.text
            wait_for(
                "ready_to_stop after the stream ended",
                lambda: lifecycle(holder)["engines"][target]["ready_to_stop"],
                timeout=10,
                interval=0.02,
            )
            after_end = time.monotonic() - long.ended_at
        assert load.failures() == []
        assert after_end <= 1.0, f"ready_to_stop {after_end:.2f}s after the stream ended"


def test_kill9_of_a_non_holder_with_a_stream_on_the_drained_engine(
    tmp_path: Path, etcd_cluster: EtcdCluster, etcd_prefix: str
) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3, itl_ms=2)
        replicas = [
            start_replica(group, tmp_path, sims, etcd_cluster.endpoints, etcd_prefix, n)
            for n in ("r0", "r1", "r2")
        ]
        holder = wait_serving(replicas)
        victim = next(r for r in replicas if r is not holder)
        LongStream(victim.url, max_tokens=4000).start()
        target = wait_for(
            "the stream's engine", lambda: stream_engine(replica_resident(holder, replica_id(victim)))
        )
        drain = holder.post("/narwhal/lifecycle/drain", {"engines": [target], "deadline_s": 300})
        assert drain.status_code == 200, drain.text
        assert lifecycle(holder)["engines"][target]["ready_to_stop"] is False
        victim.proc.kill9()
        killed = time.monotonic()
        wait_for(
            "ready_to_stop once the killed replica's key expired",
            lambda: lifecycle(holder)["engines"][target]["ready_to_stop"],
            timeout=30,
            interval=0.05,
        )
        waited = time.monotonic() - killed
        members = [m["id"] for m in lifecycle(holder)["replicas"]["members"]]
        assert replica_id(victim) not in members
        # etcd expires a lease at most TTL after its last keep-alive, checked every 0.5 s by the leader
        assert waited <= REPLICA_TTL + 1.0, f"{waited:.2f}s"


def test_kill9_of_the_holder_under_load_another_replica_controls_and_serving_never_stops(
    tmp_path: Path, etcd_cluster: EtcdCluster, etcd_prefix: str
) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3, itl_ms=2)
        replicas = [
            start_replica(group, tmp_path, sims, etcd_cluster.endpoints, etcd_prefix, n)
            for n in ("r0", "r1", "r2")
        ]
        holder = wait_serving(replicas)
        epoch = holder.get("/ready").json()["epoch"]
        assert holder.post("/narwhal/lifecycle/drain", {"engines": ["e2"]}).status_code == 200
        survivors = [r for r in replicas if r is not holder]
        with replica_load([r.url for r in replicas]) as load:
            wait_for("load on every replica", lambda: all(load.ok.get(r.url, 0) >= 5 for r in replicas))
            holder.proc.kill9()
            killed = time.time()
            new = wait_for("a new holder", lambda: holder_of(survivors), timeout=30, interval=0.05)
            served = {r.url: load.ok.get(r.url, 0) for r in survivors}
            wait_for(
                "the survivors keep serving",
                lambda: all(load.ok.get(u, 0) >= n + 20 for u, n in served.items()),
                timeout=60,
            )
        assert load.failures([r.url for r in survivors]) == []
        # when the new holder took control, from its own journal (the polling above runs under load)
        claims = wait_for(
            "the claim in the journal",
            lambda: [r for r in new.journal_rows() if r.get("event") == "replica_control"],
        )
        took = claims[0]["at"] - killed
        assert took <= LEASE_TTL + 2 * RENEW, f"takeover after {took:.2f}s"
        ready = new.get("/ready").json()
        assert ready["epoch"] == epoch + 1
        doc = lifecycle(new)
        assert doc["engines"]["e2"]["state"] == "drained" and doc["engines"]["e2"]["accepts_new"] is False
        for r in survivors:
            assert r.get("/ready").status_code == 200


async def test_rolling_restart_over_three_replicas_under_load_through_any_replica(
    temporal: Temporal, worker_queue: str, tmp_path: Path, etcd_cluster: EtcdCluster, etcd_prefix: str
) -> None:
    with proc_group(tmp_path) as group:
        sup, sims = start_supervisor(group, tmp_path, 4)
        replicas = [
            start_replica(group, tmp_path, sims, etcd_cluster.endpoints, etcd_prefix, n)
            for n in ("r0", "r1", "r2")
        ]
        holder = await asyncio.to_thread(wait_serving, replicas)
        follower = next(r for r in replicas if r is not holder)
        before = {s.iid: process_start(s.url) for s in sims}
        with replica_load([r.url for r in replicas], workers=4) as load:
            await until("load on every replica", lambda: all(load.ok.get(r.url, 0) >= 5 for r in replicas))
            handle = await start(
                temporal,
                worker_queue,
                plan(new_fleet("aa"), [follower.url], sup, configured=[r.url for r in replicas]),
            )
            res = await asyncio.wait_for(handle.result(), 240)
            served = load.total_ok()
            await until("load after the restart", lambda: load.total_ok() >= served + 20)
        assert res.ok, res.message
        for iid, e in res.engines.items():
            assert e.new_process_start is not None and e.new_process_start > before[iid]
        assert supervisor_restarts(sup) == {iid: 1 for iid in before}
        assert load.failures() == []
        for r in replicas:
            doc = lifecycle(r)
            assert all(e["state"] == "active" and e["accepts_new"] for e in doc["engines"].values())
