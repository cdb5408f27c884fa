"""The etcd JSON-gateway client against a real three-member cluster."""

from __future__ import annotations

import asyncio

import pytest

from router.ha.etcd_client import (
    EtcdClient,
    EtcdUnavailable,
    cmp_create,
    op_put,
    op_range,
    parse_endpoints,
)
from tests.support.etcd import EtcdCluster
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.integration


async def test_put_range_txn_lease_and_watch(etcd_cluster: EtcdCluster, etcd_prefix: str) -> None:
    client = EtcdClient(etcd_cluster.endpoints)
    key = (etcd_prefix + "k").encode()
    try:
        lease = await client.lease_grant(5)
        first = await client.txn([cmp_create(key, 0)], [op_put(key, b"one", lease), op_range(key)])
        assert first.succeeded
        created = first.ranges()[0][0]
        assert created.value == b"one" and created.lease == lease and created.create_revision > 0
        second = await client.txn([cmp_create(key, 0)], [op_put(key, b"two")], [op_range(key)])
        assert not second.succeeded and second.ranges()[0][0].value == b"one"
        assert await client.lease_keepalive(lease) == 5

        events: list[str] = []

        async def watch() -> None:
            async for ev in client.watch(key, start_revision=created.mod_revision + 1):
                events.append(ev.type)
                if ev.type == "DELETE":
                    return

        task = asyncio.create_task(watch())
        await client.lease_revoke(lease)  # the key goes with its lease
        await asyncio.wait_for(task, 30)
        assert events == ["DELETE"]
        assert await client.get(key) is None
        assert await client.lease_keepalive(lease) == 0  # gone: TTL 0
    finally:
        await client.aclose()


async def test_one_member_down_costs_nothing_and_none_up_is_unavailable(
    private_etcd: EtcdCluster, etcd_prefix: str
) -> None:
    key = (etcd_prefix + "k").encode()
    client = EtcdClient(private_etcd.endpoints, timeout_s=1.0, retry_s=20.0)  # election: ~1 s
    try:
        await client.put(key, b"v")
        private_etcd.stop(private_etcd.wait_leader())  # the leader: an election follows
        kv = await client.get(key)
        assert kv is not None and kv.value == b"v"
        for i in range(3):
            private_etcd.stop(i)
        with pytest.raises(EtcdUnavailable, match="etcd unavailable"):
            await client.call("kv/range", {"key": "eA=="}, retry_s=0)
    finally:
        await client.aclose()


async def test_partition_through_the_proxy(etcd_cluster: EtcdCluster, etcd_prefix: str) -> None:
    proxy = TcpProxy(etcd_cluster.members[0].client_port)
    client = EtcdClient(proxy.url, timeout_s=1.0)
    key = (etcd_prefix + "k").encode()
    try:
        await client.put(key, b"v")
        proxy.cut()
        with pytest.raises(EtcdUnavailable):
            await client.get(key)
        proxy.restore()
        kv = await client.get(key)
        assert kv is not None and kv.value == b"v"
    finally:
        await client.aclose()
        proxy.close()


@pytest.mark.parametrize(
    "raw, message",
    [
        ("", "empty etcd endpoint"),
        ("127.0.0.1:2379", "must start with http"),
        ("http://127.0.0.1", "has no port"),
        ("http://127.0.0.1:2379/v3", "scheme://host:port only"),
        ("http://127.0.0.1:99999", "not a URL"),
        ("http://127.0.0.1:2379,,http://127.0.0.1:2380", "empty etcd endpoint"),
    ],
)
def test_malformed_endpoints(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_endpoints(raw)
