"""HA against real processes and signals: lease fencing, warm-standby takeover, --resume.

Lease and standby timings are ``narwhal_testing.ha``'s (a 2 s lease, renewed every 0.3 s; the standby
probes every 0.05 s and takes over after 2 misses). Every process is stopped by PID through
``proc_group``.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.support import loopback
from tests.support.fleet import FAST, start_sims
from tests.support.ha import (
    NOT_CONTROLLING,
    ha_router,
    sigstop_outside_lease_lock,
    standby_router,
    start_pair,
    state_file,
)
from tests.support.lifecycle import running_threads
from tests.support.procs import proc_group
from tests.support.router import RouterHandle
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration


def _complete(url: str) -> httpx.Response:
    body = {"model": "sim-model", "prompt": "hello", "max_tokens": 8}
    return loopback.post(url + "/v1/completions", json=body, timeout=30)


@dataclass
class FailoverLoad:
    """Clients that know both routers: each request goes to the first one that serves it."""

    urls: list[str]
    ok: int = 0
    by_url: dict[str, int] = field(default_factory=dict)
    unserved: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


@contextmanager
def failover_load(urls: list[str], workers: int = 4) -> Iterator[FailoverLoad]:
    load = FailoverLoad(urls)
    lock = threading.Lock()

    def worker(i: int) -> None:
        with loopback.client(timeout=10) as client:
            while not load.stop.is_set():
                body = {"model": "sim-model", "prompt": f"load {i}", "max_tokens": 16, "stream": i % 2 == 0}
                served_by, last = "", ""
                for url in load.urls:
                    try:
                        r = client.post(url + "/v1/completions", json=body)
                    except httpx.HTTPError as exc:
                        last = repr(exc)
                        continue
                    if (
                        r.status_code == 200 and "[DONE]" in r.text
                        if body["stream"]
                        else r.status_code == 200
                    ):
                        served_by = url
                        break
                    last = f"{r.status_code} {r.text[:120]}"
                with lock:
                    if served_by:
                        load.ok += 1
                        load.by_url[served_by] = load.by_url.get(served_by, 0) + 1
                    else:
                        load.unserved.append(last)
                if not served_by:
                    time.sleep(0.05)

    with running_threads(worker, workers, load.stop):
        yield load


def _drain(router: RouterHandle, iid: str) -> None:
    r = router.post("/narwhal/lifecycle/drain", {"engines": [iid], "deadline_s": 120})
    assert r.status_code == 200, r.text
    wait_for(
        f"{iid} drained", lambda: router.get("/narwhal/lifecycle").json()["engines"][iid]["ready_to_stop"]
    )


def test_kill9_primary_mid_stream_standby_takes_over(tmp_path: Path) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3, itl_ms=20)
        a = ha_router(group, tmp_path, sims, "a", wait_ready=True)
        assert a.get("/ready").json()["epoch"] == 1
        _drain(a, "e2")
        b = standby_router(group, tmp_path, sims, a)
        assert b.get("/health").json()["status"] == "standby"
        wait_for("b shadows", lambda: b.get("/ready").json()["reason"] == "shadowing")
        assert b.get("/ready").status_code == 503
        assert b.post("/narwhal/lifecycle/drain", {"engines": ["e1"]}).json()["error"] == NOT_CONTROLLING
        with failover_load([a.url, b.url]) as load:
            wait_for("traffic on the primary", lambda: load.ok >= 12)
            # the standby mirrors the primary's lease-validated handoff in its own state file ...
            wait_for("standby mirror", lambda: state_file(tmp_path, "b")["counters"]["served"] >= 10)
            mirrored = state_file(tmp_path, "b")
            assert mirrored["epoch"] == 1 and mirrored["holder"] == a.get("/ready").json()["holder"]
            # ... while its own state stays fresh (epoch 0, nothing served)
            own = b.get("/narwhal/handoff").json()
            assert own["epoch"] == 0 and own["counters"]["served"] == 0
            a.proc.kill9()  # mid-stream: streams are running on the primary right now
            # how long the takeover takes is measured by bench/takeover.py, not asserted here
            wait_for("standby /ready 200", lambda: b.get("/ready").status_code == 200, timeout=15)
            served_at_takeover = load.ok
            wait_for("traffic on the standby", lambda: load.by_url.get(b.url, 0) >= 12)
        ready = b.get("/ready").json()
        assert ready["epoch"] == 2 and ready["holder"].startswith("router-b:")
        assert b.get("/health").json()["status"] == "ok"
        doc = b.get("/narwhal/handoff").json()
        assert doc["epoch"] == 2
        # counters carried over: everything the primary had served (and mirrored) plus the standby's own
        assert doc["counters"]["served"] >= mirrored["counters"]["served"] + 12
        # the drained engine stays drained and out of placement
        lifecycle = b.get("/narwhal/lifecycle").json()
        assert (
            lifecycle["engines"]["e2"]["state"] == "drained" and not lifecycle["engines"]["e2"]["accepts_new"]
        )
        assert lifecycle["router"]["controls_fleet"] is True
        assert doc["roles"] == mirrored["roles"]
        metrics = b.metrics()
        assert metrics["narwhal_router_lease_epoch"] == 2 and metrics["narwhal_takeover_seconds"] > 0
        assert "TAKEOVER: claimed epoch 2 after" in b.proc.output()
        assert served_at_takeover > 0 and load.by_url.get(a.url, 0) > 0


def test_drain_acknowledged_after_the_standbys_last_poll_survives_takeover(tmp_path: Path) -> None:
    """The standby is frozen (no polls) while the primary drains e1 and dies: the hold still survives,
    because the holder writes its handoff beside the shared lease before answering the drain."""
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3, itl_ms=5)
        a, b = start_pair(group, tmp_path, sims)
        b.proc.signal(signal.SIGSTOP)  # from here on the standby's snapshot predates the drain
        try:
            r = a.post("/narwhal/lifecycle/drain", {"engines": ["e1"], "deadline_s": 120})
            assert r.status_code == 200, r.text
            old_start = r.json()["engines"]["e1"]["old_process_start"]
            assert old_start is not None
            a.proc.kill9()
        finally:
            b.proc.signal(signal.SIGCONT)
        assert state_file(tmp_path, "b")["lifecycle"]["records"] == []  # the poll never saw the drain
        wait_for("standby takes over", lambda: b.get("/ready").status_code == 200, timeout=15)
        e1 = b.get("/narwhal/lifecycle").json()["engines"]["e1"]
        assert e1["state"] in ("draining", "drained") and e1["accepts_new"] is False
        assert e1["old_process_start"] == old_start
        assert b.get("/ready").json()["epoch"] == 2
        assert "taking over with the holder's shared handoff" in b.proc.output()


def test_standby_polls_with_the_control_token_when_reads_are_protected(tmp_path: Path) -> None:
    env = {"NARWHAL_HA_TEST_TOKEN": "s3cret"}
    extra = {**FAST, "control": {"token_env": "NARWHAL_HA_TEST_TOKEN", "protect_reads": True}}
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 2, itl_ms=5)
        a, b = start_pair(group, tmp_path, sims, extra=extra, env=env)  # the standby's polls are authorised
        assert loopback.get(a.url + "/narwhal/handoff", timeout=5).status_code == 401
        a.proc.kill9()
        wait_for("standby takes over", lambda: b.get("/ready").status_code == 200, timeout=15)
        assert b.get("/ready").json()["epoch"] == 2


def test_sigstop_past_the_lease_fences_the_old_primary(tmp_path: Path) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3, itl_ms=5)
        a, b = start_pair(group, tmp_path, sims)
        assert _complete(a.url).status_code == 200
        sigstop_outside_lease_lock(a, tmp_path / "router.lease")
        try:
            wait_for("standby takes over", lambda: b.get("/ready").status_code == 200, timeout=15)
        finally:
            a.proc.signal(signal.SIGCONT)
        wait_for("old primary fenced", lambda: a.get("/health").json()["status"] == "fenced")
        # /health says fenced as soon as the lease is locally invalid ("lease expired"); the thawed
        # renewal task's failed renewal then fences it for good with its own reason
        wait_for("renewal fails", lambda: a.get("/ready").json()["reason"] == "lease renewal failed")
        # its own file as the fence left it (a write begun before the freeze may finish after it:
        # state of epoch 1, taken while it held the lease); from here on nothing is written
        primary_file = (tmp_path / "a.state.json").read_bytes()
        assert json.loads(primary_file)["epoch"] == 1
        ready = a.get("/ready")
        assert ready.status_code == 503 and ready.json()["reason"] == "lease renewal failed"
        assert ready.json()["control_ready"] is False
        for action, body in (
            ("drain", {"engines": ["e0"], "deadline_s": 60}),
            ("readmit", {"engines": ["e0"]}),
        ):
            r = a.post(f"/narwhal/lifecycle/{action}", body)
            assert r.status_code == 503 and r.json()["error"] == NOT_CONTROLLING
        assert a.get("/narwhal/lifecycle").json()["engines"]["e0"]["state"] == "active"
        r = _complete(a.url)
        assert r.status_code == 503 and r.json()["error"]["code"] == "standby"
        assert a.get("/narwhal/handoff").status_code == 200
        assert _complete(b.url).status_code == 200
        assert b.get("/ready").json()["epoch"] == 2
        time.sleep(0.5)  # several of the fenced router's write periods: its own file is left alone
        assert (tmp_path / "a.state.json").read_bytes() == primary_file
        assert "router fenced: lease renewal failed for epoch 1" in a.proc.output()
        a.proc.stop()
        assert (tmp_path / "a.state.json").read_bytes() == primary_file  # not even at shutdown


def test_sigterm_then_resume_restores_counters_roles_ejections_and_holds(tmp_path: Path) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 4, roles=["prefill", "prefill", "decode", "decode"], itl_ms=2)
        a = ha_router(group, tmp_path, sims, "a", wait_ready=True)
        for _ in range(6):
            assert _complete(a.url).status_code == 200
        _drain(a, "e3")
        victim = sims[1].proc
        assert victim is not None
        victim.kill9()  # e1 dies: the liveness sweep ejects it
        wait_for("e1 ejected", lambda: "e1" in a.get("/narwhal/handoff").json()["ejected"])
        before = a.get("/narwhal/handoff").json()
        a.proc.stop()  # SIGTERM: final snapshot, lease released
        assert "Traceback" not in a.proc.log_path.read_text()
        saved = state_file(tmp_path, "a")
        assert saved["counters"]["served"] == before["counters"]["served"] == 6
        assert saved["ejected"] == ["e1"] and saved["epoch"] == 1
        # an operator-visible role change made while the router was down is what resume must restore
        saved["roles"]["e2"] = "prefill"
        (tmp_path / "a.state.json").write_text(json.dumps(saved))
        again = ha_router(group, tmp_path, sims, "a", "--resume")
        wait_for(
            "identities validated",
            lambda: again.get("/ready").json()["reason"] != "engine identity validation pending",
        )
        doc = again.get("/narwhal/handoff").json()
        assert doc["epoch"] == 2 and doc["run"] != saved["run"]
        assert doc["counters"]["served"] == 6 and doc["counters"]["offered"] == saved["counters"]["offered"]
        assert doc["roles"]["e2"] == "prefill"
        assert doc["ejected"] == ["e1"]
        e3 = again.get("/narwhal/lifecycle").json()["engines"]["e3"]
        assert e3["state"] == "drained" and not e3["accepts_new"]
        assert e3["old_process_start"] == saved["lifecycle"]["records"][0]["old_process_start"]
        assert "handoff applied: gap" in again.proc.output()
        assert _complete(again.url).status_code == 200


@pytest.mark.parametrize("kind", ["torn", "foreign", "invalid"])
def test_unusable_state_file_is_refused_without_partial_application(tmp_path: Path, kind: str) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 2, itl_ms=2)
        a = ha_router(group, tmp_path, sims, "a", wait_ready=True)
        assert _complete(a.url).status_code == 200
        a.proc.stop()
        path = tmp_path / "a.state.json"
        saved = json.loads(path.read_text())
        if kind == "torn":
            content = path.read_bytes()[: len(path.read_bytes()) // 2]
            reason = "handoff file torn: "
        elif kind == "foreign":
            saved["engines"] = ["x0", "x1"]
            saved["roles"] = {"x0": "prefill", "x1": "decode"}
            saved["lifecycle"]["process_starts"] = {}
            content = json.dumps(saved).encode()
            reason = "handoff names ['x0', 'x1'], this fleet is ['e0', 'e1']"
        else:
            saved["counters"]["served"] = True
            content = json.dumps(saved).encode()
            reason = "handoff file invalid"
        path.write_bytes(content)
        # the same damage in the shared copy beside the lease (a valid one there would be resumed)
        (tmp_path / "router.lease.handoff.json").write_bytes(content)
        again = ha_router(group, tmp_path, sims, "a", "--resume")
        ready = again.get("/ready")
        assert ready.status_code == 503
        assert ready.json()["reason"].startswith(f"whole-wave restart required: handoff rejected: {reason}")
        doc = again.get("/narwhal/handoff").json()
        assert doc["counters"]["served"] == 0  # nothing of the refused file was applied
        assert doc["lifecycle"]["wave_id"] and all(
            r["state"] == "blocked" for r in doc["lifecycle"]["records"]
        )
        assert (tmp_path / "a.state.json.rejected").read_bytes() == content
        assert f"handoff not applied ({path}): {reason}" in again.proc.output()
