"""HA on a real three-member etcd cluster: claim, shadow, kill -9 takeover, SIGSTOP fencing,
--resume from etcd, etcd unreachable at start, and foreign documents under the prefix.

Tests that stop, freeze or partition etcd members are in test_ha_etcd_faults.py (own cluster).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.support.etcd import EtcdCluster
from tests.support.etcd_ha import (
    etcd_pair,
    etcd_pair_holding_e0,
    etcd_router,
    etcd_standby,
    key,
    proxied,
    proxy_endpoints,
    stored_handoff,
)
from tests.support.fleet import restart_sim, start_sims
from tests.support.ha import (
    NOT_CONTROLLING,
    controls,
    drain,
    engine_state,
    epoch_of,
    held,
    ready,
    wait_controls,
)
from tests.support.procs import proc_group
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration


def test_claim_shadow_and_acknowledged_drains_survive_repeated_kill9(
    tmp_path: Path, etcd_cluster: EtcdCluster, etcd_prefix: str
) -> None:
    """Primary claims (epoch ≥ 1, every key under the prefix), standby shadows; then, repeatedly, a
    drain acknowledged right before ``kill -9`` of the holder survives the takeover, and the killed
    router comes back without taking control."""
    eps = etcd_cluster.endpoints
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3, itl_ms=5)
        a, b = etcd_pair(group, tmp_path, sims, eps, etcd_prefix)
        status, body = ready(a)
        assert status == 200 and body["epoch"] >= 1 and body["holder"].startswith("router-a:")
        # shadowing (a probe that missed under load may block a takeover for a moment: it clears)
        wait_for("b shadows", lambda: ready(b)[0] == 503 and ready(b)[1]["reason"] == "shadowing")
        holder = key(etcd_cluster, etcd_prefix, "holder")
        assert holder is not None and json.loads(str(holder["value"]))["holder"] == body["holder"]
        assert int(holder["lease"]) > 0  # attached to an etcd lease
        assert key(etcd_cluster, etcd_prefix, "epoch")["value"] == str(body["epoch"])  # type: ignore[index]
        wait_for("handoff in etcd", lambda: key(etcd_cluster, etcd_prefix, "handoff") is not None)
        under = etcd_cluster.keys(etcd_prefix)
        assert under == sorted(etcd_prefix + k for k in ("epoch", "handoff", "holder"))
        assert b.post("/narwhal/lifecycle/drain", {"engines": ["e1"]}).json()["error"] == NOT_CONTROLLING

        holder_r, standby_r, names = a, b, ("a", "b")
        # drain e0, then readmit it on a new process, then drain again: each acknowledged right
        # before the holder is killed, each visible on the successor
        for round_no, action in enumerate(("drain", "readmit", "drain"), start=1):
            before = epoch_of(holder_r)
            if action == "drain":
                r = drain(holder_r, "e0")
            else:
                restart_sim(group, sims[0])
                r = holder_r.post("/narwhal/lifecycle/readmit", {"engines": ["e0"]}, timeout=60)
            assert r.status_code == 200, r.text
            stored = stored_handoff(etcd_cluster, etcd_prefix)
            assert stored["epoch"] == before  # written (fenced) before the 200
            holder_r.proc.kill9()
            wait_controls(standby_r, timeout=60)
            assert epoch_of(standby_r) == before + 1
            state = engine_state(standby_r, "e0")
            if action == "drain":
                assert held(standby_r, "e0"), (round_no, state)
            else:
                assert state["state"] == "active" and state["accepts_new"], (round_no, state)
            # the killed router returns as a plain primary: it must not take control
            name = names[0]
            back = etcd_router(group, tmp_path, sims, name, eps, etcd_prefix)
            wait_for(
                "returning router refused",
                lambda back=back: ready(back)[1].get("reason") == "lease held by another router",
            )
            assert not controls(back) and controls(standby_r)
            back.proc.stop()
            # ... and rejoins as the standby of the new holder (shadowing)
            back = etcd_standby(group, tmp_path, sims, name, eps, etcd_prefix, standby_r)
            holder_r, standby_r, names = standby_r, back, (names[1], names[0])
        assert epoch_of(holder_r) >= 4


def test_sigstop_past_the_ttl_cannot_acknowledge_or_overwrite(
    tmp_path: Path, etcd_cluster: EtcdCluster, etcd_prefix: str
) -> None:
    eps = etcd_cluster.endpoints
    with proc_group(tmp_path) as group:
        sims, a, b = etcd_pair_holding_e0(group, tmp_path, eps, etcd_prefix)
        a_holder = ready(a)[1]["holder"]
        a.proc.signal(signal.SIGSTOP)
        try:
            wait_controls(b, timeout=60)
            assert held(b, "e0")  # a's acknowledged drain survived
            restart_sim(group, sims[0])
            r = b.post("/narwhal/lifecycle/readmit", {"engines": ["e0"]}, timeout=60)
            assert r.status_code == 200, r.text
            after_b = stored_handoff(etcd_cluster, etcd_prefix)
            assert after_b["holder"] == ready(b)[1]["holder"] and after_b["epoch"] == 2
        finally:
            a.proc.signal(signal.SIGCONT)
        # the old primary resumes: no acknowledgement, no write over the new holder's handoff
        for action, body in (
            ("drain", {"engines": ["e2"], "deadline_s": 60}),
            ("readmit", {"engines": ["e1"]}),
        ):
            r = a.post(f"/narwhal/lifecycle/{action}", body)
            assert r.status_code == 503, r.text
        wait_for("old primary fenced", lambda: ready(a)[1].get("reason") == "lease renewal failed")
        b_holder = ready(b)[1]["holder"]
        stored = stored_handoff(etcd_cluster, etcd_prefix)
        assert stored["holder"] == b_holder != a_holder and stored["epoch"] == 2
        assert stored["_mod_revision"] >= after_b["_mod_revision"]
        holder = key(etcd_cluster, etcd_prefix, "holder")
        assert holder is not None and json.loads(str(holder["value"]))["holder"] == b_holder
        assert engine_state(b, "e0")["state"] == "active" and not held(b, "e2")
        assert controls(b) and not controls(a)


def test_resume_reads_the_handoff_from_etcd(
    tmp_path: Path, etcd_cluster: EtcdCluster, etcd_prefix: str
) -> None:
    eps = etcd_cluster.endpoints
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3, itl_ms=5)
        a = etcd_router(group, tmp_path, sims, "a", eps, etcd_prefix, wait_ready=True)
        assert drain(a, "e1").status_code == 200
        assert a.proc.stop() == 0  # graceful: final fenced write, lease revoked
        assert key(etcd_cluster, etcd_prefix, "holder") is None
        # a fresh router with an empty state path of its own: only etcd knows the drain
        c = etcd_router(group, tmp_path, sims, "c", eps, etcd_prefix, "--resume", wait_ready=False)
        wait_controls(c)
        assert epoch_of(c) == 2 and held(c, "e1")
        # the local state file is still written (by the writer thread, after the fenced etcd write:
        # under load it can trail the first look at /ready)
        state = tmp_path / "c.state.json"
        wait_for("local copy", lambda: state.exists() and json.loads(state.read_text())["epoch"] == 2)


def test_etcd_unreachable_at_start_then_back(
    tmp_path: Path, etcd_cluster: EtcdCluster, etcd_prefix: str
) -> None:
    with proxied(etcd_cluster) as proxies, proc_group(tmp_path) as group:
        for p in proxies:
            p.cut()
        sims = start_sims(group, 2, itl_ms=5)
        a = etcd_router(group, tmp_path, sims, "a", proxy_endpoints(proxies), etcd_prefix)
        wait_for("not ready, naming etcd", lambda: "etcd unavailable" in ready(a)[1].get("reason", ""))
        assert ready(a)[0] == 503
        assert a.get("/health").status_code == 200
        assert drain(a, "e0").status_code == 503
        for p in proxies:
            p.restore()
        wait_controls(a, timeout=60)
        assert epoch_of(a) >= 1
        assert "Traceback" not in a.proc.output()


@pytest.mark.parametrize(
    "name, value, reason",
    [
        ("holder", b'{"owner": "someone else"}', "foreign or torn"),
        ("holder", b'{"schema": "narwhal.etcd-holder", "schema_ver', "foreign or torn"),
        ("epoch", b"seven", "not an epoch counter"),
        ("handoff", b'{"schema": "narwhal.handoff", "schema_version": 1, "at": 1', "foreign or torn"),
        ("handoff", b'{"kind": "ConfigMap"}', "foreign or torn"),
    ],
)
def test_foreign_or_torn_document_under_the_prefix_is_refused_and_left_alone(
    tmp_path: Path, etcd_cluster: EtcdCluster, etcd_prefix: str, name: str, value: bytes, reason: str
) -> None:
    etcd_cluster.put(etcd_prefix + name, value)
    before = key(etcd_cluster, etcd_prefix, name)
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 2, itl_ms=5)
        a = etcd_router(group, tmp_path, sims, "a", etcd_cluster.endpoints, etcd_prefix)
        wait_for("refused with a reason", lambda: reason in ready(a)[1].get("reason", ""))
        assert ready(a)[0] == 503 and f"{etcd_prefix}{name}" in ready(a)[1]["reason"]
        assert drain(a, "e0").status_code == 503
        assert a.get("/narwhal/lifecycle").json()["engines"]["e0"]["state"] == "active"  # nothing applied
    assert key(etcd_cluster, etcd_prefix, name) == before  # never overwritten
    if name != "epoch":
        assert key(etcd_cluster, etcd_prefix, "epoch") is None  # no claim was made
