"""The HA process harness on etcd: ``narwhal-serve`` routers whose lease, epoch and handoff live
under a key prefix of a real etcd cluster (``narwhal_testing.etcd``), key reads, and TCP proxies
in front of the members for partitions. The readers (``ready``, ``controls``, ``held``, ...) are
``narwhal_testing.ha``'s.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from narwhal_testing.etcd import EtcdCluster
from narwhal_testing.fleet import SimEngine, start_sims
from narwhal_testing.ha import drain, ha_fleet, ready
from narwhal_testing.procs import ProcGroup
from narwhal_testing.router import RouterHandle, start_router
from narwhal_testing.tcp_proxy import TcpProxy
from narwhal_testing.waits import wait_for

# etcd's smallest lease TTL on the test cluster (heartbeat 100 ms, election 1 s) is 2 s. Local
# validity 3.5 s covers a leader election (1–2 s) plus retries on a loaded machine.
LEASE = ["--lease-ttl", "4", "--lease-renew-interval", "0.5", "--lease-safety-margin", "0.5"]
TTL_PLUS_MARGIN = 4.5
STANDBY = ["--standby-probe-interval", "0.1", "--standby-takeover-after", "3"]


def etcd_router(
    group: ProcGroup,
    tmp_path: Path,
    sims: Sequence[SimEngine],
    name: str,
    endpoints: str,
    prefix: str,
    *args: str,
    **kw: Any,
) -> RouterHandle:
    """Router ``name`` on etcd ``endpoints`` (comma-separated) under ``prefix``; ``args`` are more
    ``narwhal-serve`` flags, ``kw`` go to ``start_router``."""
    fleet = ha_fleet(tmp_path, sims, name)
    flags = ["--etcd-endpoints", endpoints, "--etcd-prefix", prefix, "--router-id", f"router-{name}", *LEASE]
    return start_router(group, fleet, tmp_path, [*flags, *args], name=name, **kw)


def etcd_standby(
    group: ProcGroup,
    tmp_path: Path,
    sims: Sequence[SimEngine],
    name: str,
    endpoints: str,
    prefix: str,
    primary: RouterHandle,
    **kw: Any,
) -> RouterHandle:
    """Router ``name`` as the warm standby of ``primary``, returned once it is shadowing."""
    b = etcd_router(
        group, tmp_path, sims, name, endpoints, prefix, "--standby-of", primary.url, *STANDBY, **kw
    )
    wait_for(f"{name} shadowing", lambda: ready(b)[1].get("reason") == "shadowing", timeout=60)
    return b


def etcd_pair(
    group: ProcGroup,
    tmp_path: Path,
    sims: Sequence[SimEngine],
    endpoints: str,
    prefix: str,
    primary_endpoints: str | None = None,
) -> tuple[RouterHandle, RouterHandle]:
    """Primary ``a`` (ready: it holds the lease) and standby ``b`` (shadowing). ``primary_endpoints``
    lets the primary reach etcd another way (through proxies a test can cut)."""
    a = etcd_router(group, tmp_path, sims, "a", primary_endpoints or endpoints, prefix, wait_ready=True)
    return a, etcd_standby(group, tmp_path, sims, "b", endpoints, prefix, a)


def etcd_pair_holding_e0(
    group: ProcGroup, tmp_path: Path, endpoints: str, prefix: str, primary_endpoints: str | None = None
) -> tuple[list[SimEngine], RouterHandle, RouterHandle]:
    """Three engines, ``etcd_pair`` over them, and a drain of ``e0`` acknowledged by the primary:
    where the etcd fault tests start (the hold a successor must find)."""
    sims = start_sims(group, 3, itl_ms=5)
    a, b = etcd_pair(group, tmp_path, sims, endpoints, prefix, primary_endpoints)
    r = drain(a, "e0")
    if r.status_code != 200:
        raise AssertionError(f"the primary did not acknowledge the drain of e0: {r.status_code} {r.text}")
    return sims, a, b


def key(cluster: EtcdCluster, prefix: str, name: str) -> dict[str, Any] | None:
    kv = cluster.get(prefix + name)
    return dict(kv) if kv is not None else None


def stored_handoff(cluster: EtcdCluster, prefix: str) -> dict[str, Any]:
    kv = key(cluster, prefix, "handoff")
    assert kv is not None, "no handoff in etcd"
    doc: dict[str, Any] = json.loads(str(kv["value"]))
    doc["_mod_revision"] = int(kv["mod_revision"])
    return doc


@contextmanager
def proxied(cluster: EtcdCluster) -> Iterator[list[TcpProxy]]:
    """A TCP proxy in front of every member (cut them for a partition); closed at exit."""
    proxies = [TcpProxy(m.client_port) for m in cluster.members]
    try:
        yield proxies
    finally:
        for p in proxies:
            p.close()


def proxy_endpoints(proxies: Sequence[TcpProxy]) -> str:
    return ",".join(p.url for p in proxies)
