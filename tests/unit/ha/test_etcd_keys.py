"""The etcd key layout is one module's: the lease backend and the replicas address the same keys."""

from __future__ import annotations

from router.clock import FakeClock
from router.ha.etcd_client import EtcdClient
from router.ha.etcd_keys import EtcdKeys, HolderDoc, default_prefix, holder_router_id
from router.ha.etcd_lease import EtcdLease, EtcdLeaseSettings
from router.replicas.service import ReplicaSettings


def test_the_lease_backend_and_a_replica_use_the_same_keys_under_the_prefix() -> None:
    prefix = default_prefix("org/Model-7B")
    assert prefix == "/narwhal/org_Model-7B/"
    keys = EtcdKeys(prefix)
    assert (keys.holder, keys.epoch, keys.handoff) == (
        b"/narwhal/org_Model-7B/holder",
        b"/narwhal/org_Model-7B/epoch",
        b"/narwhal/org_Model-7B/handoff",
    )
    assert keys.replica("r1") == b"/narwhal/org_Model-7B/replicas/r1"
    assert keys.replica_id(keys.replica("r-2")) == "r-2"
    lease = EtcdLease(
        EtcdLeaseSettings(router_id="a", prefix=prefix, model="org/Model-7B"),
        EtcdClient("http://127.0.0.1:9"),
        clock=FakeClock(),
    )
    replica = ReplicaSettings(prefix=prefix, replica_id="r1", control_url="http://r1.test")
    assert (lease.holder_key, lease.handoff_key) == (replica.holder_key, replica.handoff_key)
    assert lease.epoch_key == keys.epoch and replica.member_key == keys.replica("r1")
    # one watch covers both state keys: handoff sorts before holder, the range ends just after it
    assert keys.handoff < keys.holder < keys.state_range_end


def test_a_replica_reads_the_router_id_of_the_holder_document_the_backend_writes() -> None:
    doc = HolderDoc(holder="a:1234", epoch=3, router_id="replica-a", claimed_at=1.0)
    assert holder_router_id(doc.encode()) == "replica-a"
    for unreadable in (b"", b"not json", b"[1]", b'{"router_id": 7}', b"\xff"):
        assert holder_router_id(unreadable) == ""
