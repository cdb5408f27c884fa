"""Helpers for the etcd-backend HA tests: routers on etcd, safe HTTP reads, etcd key reads."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from tests.integration.lifecycle_support import wait_for
from tests.support.etcd import EtcdCluster
from tests.support.fleet import SimEngine, write_fleet
from tests.support.procs import ProcGroup
from tests.support.router import RouterHandle, start_router

FAST = {"controller": {"monitor_interval_s": 0.2}, "recovery": {"liveness_every": 2, "readmit_every": 2}}
# etcd's smallest lease TTL on the test cluster (heartbeat 100 ms, election 1 s) is 2 s. Local
# validity 3.5 s covers a leader election (1–2 s) plus retries on a loaded machine.
LEASE = ["--lease-ttl", "4", "--lease-renew-interval", "0.5", "--lease-safety-margin", "0.5"]
TTL_PLUS_MARGIN = 4.5
STANDBY = ["--standby-probe-interval", "0.1", "--standby-takeover-after", "3"]
NOT_CONTROLLING = "this router does not control the fleet"


def etcd_router(
    group: ProcGroup,
    tmp_path: Path,
    sims: Sequence[SimEngine],
    name: str,
    endpoints: str,
    prefix: str,
    *args: str,
    state_name: str | None = None,
    **kw: Any,
) -> RouterHandle:
    fleet = write_fleet(
        tmp_path,
        sims,
        name=f"{name}.fleet.json",
        state_path=str(tmp_path / f"{state_name or name}.state.json"),
        extra=FAST,
    )
    flags = ["--etcd-endpoints", endpoints, "--etcd-prefix", prefix, "--router-id", f"router-{name}", *LEASE]
    return start_router(group, fleet, tmp_path, [*flags, *args], name=name, **kw)


def ready(router: RouterHandle) -> tuple[int, dict[str, Any]]:
    """(status, body) of /ready; (0, {}) while the router does not answer."""
    try:
        r = router.get("/ready", timeout=2.0)
    except httpx.HTTPError:
        return 0, {}
    try:
        body = r.json()
    except ValueError:
        body = {}
    return r.status_code, body if isinstance(body, dict) else {}


def controls(router: RouterHandle) -> bool:
    return ready(router)[0] == 200


def epoch_of(router: RouterHandle) -> int:
    return int(ready(router)[1].get("epoch", 0))


def drain(router: RouterHandle, iid: str) -> httpx.Response:
    return router.post("/narwhal/lifecycle/drain", {"engines": [iid], "deadline_s": 300}, timeout=30)


def engine_state(router: RouterHandle, iid: str) -> dict[str, Any]:
    doc: dict[str, Any] = router.get("/narwhal/lifecycle").json()["engines"][iid]
    return doc


def held(router: RouterHandle, iid: str) -> bool:
    """The engine is held out of placement by a drain (draining or drained, not accepting new)."""
    e = engine_state(router, iid)
    return e["state"] in ("draining", "drained") and e["accepts_new"] is False


def key(cluster: EtcdCluster, prefix: str, name: str) -> dict[str, Any] | None:
    kv = cluster.get(prefix + name)
    return dict(kv) if kv is not None else None


def stored_handoff(cluster: EtcdCluster, prefix: str) -> dict[str, Any]:
    kv = key(cluster, prefix, "handoff")
    assert kv is not None, "no handoff in etcd"
    doc: dict[str, Any] = json.loads(str(kv["value"]))
    doc["_mod_revision"] = int(kv["mod_revision"])
    return doc


def wait_controls(router: RouterHandle, timeout: float = 30.0) -> None:
    wait_for(f"{router.url} controls the fleet", lambda: controls(router), timeout=timeout)
