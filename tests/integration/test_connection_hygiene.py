"""Connection hygiene against a real router under a real fd limit (RLIMIT_NOFILE set in the child
before it execs ``narwhal-serve``): a flood of idle and half-header connections never takes the
descriptors the lease renewal needs, so the router keeps (or regains) control without a restart;
idle and half-header connections are closed within the documented timeouts."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fleet import start_sims, write_fleet
from tests.support.lifecycle import wait_for
from tests.support.procs import ProcGroup, free_port, proc_group, script, wait_http
from tests.support.router import RouterHandle

pytestmark = pytest.mark.integration
NOFILE = 300
LEASE = ["--lease-ttl", "0.8", "--lease-renew-interval", "0.2", "--lease-safety-margin", "0.1"]
_SETRLIMIT = (
    "import os, resource, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[1]))); "
    "os.execv(sys.argv[2], sys.argv[2:])"
)


def _limited_router(group: ProcGroup, tmp_path: Path, serving: dict[str, float]) -> RouterHandle:
    sims = start_sims(group, 2, roles=["prefill", "decode"], itl_ms=1)
    port, control = free_port(), free_port()
    extra = {"serving": serving, "controller": {"monitor_interval_s": 0.2}, "control": {"port": control}}
    fleet = write_fleet(tmp_path, sims, extra=extra)
    journal = tmp_path / "router.journal.jsonl"
    serve = [script("narwhal-serve"), "--fleet", str(fleet), "--host", "127.0.0.1", "--port", str(port)]
    serve += ["--journal", str(journal), "--lease-path", str(tmp_path / "router.lease"), *LEASE]
    proc = group.start("router", [sys.executable, "-c", _SETRLIMIT, str(NOFILE), *serve])
    url, control_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{control}"
    wait_http(control_url + "/ready", timeout=30, proc=proc)
    return RouterHandle(url, port, proc, journal, control_url)


@contextlib.contextmanager
def _flood(port: int, idle: int, half: int) -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    try:
        for i in range(idle + half):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.settimeout(5)
            try:
                s.connect(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            if i >= idle:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: router\r\nX-Slow: ")  # headers never end
            socks.append(s)
        yield socks
    finally:
        for s in socks:
            s.close()


def _closed_by_peer(s: socket.socket) -> bool:
    readable, _, _ = select.select([s], [], [], 0)
    if not readable:
        return False
    try:
        return s.recv(4096) == b""
    except OSError:
        return True


def test_fd_flood_never_costs_the_lease_and_the_router_controls_after_it(tmp_path: Path) -> None:
    serving = {"idle_timeout_s": 120.0, "header_timeout_s": 120.0, "fd_reserve": 64}
    with proc_group(tmp_path) as group:
        router = _limited_router(group, tmp_path, serving)
        epoch = router.get("/ready", control=True).json()["epoch"]
        bound = _metrics(router)["narwhal_client_connection_bound"]
        assert bound == (NOFILE - 64) // 2
        with _flood(router.port, idle=2 * NOFILE, half=NOFILE // 3):
            # the flood holds more connections than the process has descriptors
            wait_for("flood refused", lambda: _metrics(router)["narwhal_connections_refused_total"] > 0)
            lease_before = json.loads((tmp_path / "router.lease").read_text())["updated_at"]
            wait_for(  # renewals keep landing during the flood (several renew intervals)
                "renewal during the flood",
                lambda: (
                    json.loads((tmp_path / "router.lease").read_text())["updated_at"] > lease_before + 0.5
                ),
            )
            ready = router.get("/ready", control=True)  # the control listener still takes operators
            assert ready.status_code == 200 and ready.json()["epoch"] == epoch
            assert _metrics(router)["narwhal_client_connections"] <= bound + 32
        # after the flood: the router serves and controls, same epoch, no restart
        wait_for("client listener free", lambda: _metrics(router)["narwhal_client_connections"] < 10)
        body = {"model": "sim-model", "prompt": "after the flood", "max_tokens": 4}
        assert router.post("/v1/completions", body).status_code == 200
        assert router.get("/ready", control=True).json()["epoch"] == epoch
        assert router.proc.alive() and "router fenced" not in router.proc.output()


def _wait_closed(socks: list[socket.socket], within: float) -> float:
    """Seconds until the router closed every socket; fails after ``within`` + slack."""
    started = time.monotonic()
    open_socks = set(socks)
    deadline = started + within + 10.0  # generous slack for a loaded machine
    while open_socks and time.monotonic() < deadline:
        open_socks = {s for s in open_socks if not _closed_by_peer(s)}
        time.sleep(0.05)
    elapsed = time.monotonic() - started
    assert not open_socks, f"{len(open_socks)} connections still open after {elapsed:.1f}s"
    return elapsed


def test_idle_and_half_header_connections_are_closed_within_the_timeouts(tmp_path: Path) -> None:
    serving = {"idle_timeout_s": 1.5, "header_timeout_s": 0.5}
    with proc_group(tmp_path) as group:
        router = _limited_router(group, tmp_path, serving)
        # never a complete request head (silent, or headers that never end): header timeout
        with _flood(router.port, idle=40, half=40) as socks:
            assert len(socks) == 80
            _wait_closed(socks, within=0.5)
        assert _metrics(router)["narwhal_header_timeouts_total"] >= 40
        # keep-alive connections idle after a complete request: idle timeout
        keepalive: list[socket.socket] = []
        try:
            for _ in range(10):
                s = socket.create_connection(("127.0.0.1", router.port), timeout=5)
                s.sendall(b"GET /health HTTP/1.1\r\nHost: router\r\n\r\n")
                assert s.recv(4096).startswith(b"HTTP/1.1 200")
                keepalive.append(s)
            _wait_closed(keepalive, within=1.5)
        finally:
            for s in keepalive:
                s.close()
        body = {"model": "sim-model", "prompt": "x", "max_tokens": 2}
        assert router.post("/v1/completions", body).status_code == 200


def _metrics(router: RouterHandle) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in router.get("/metrics", control=True).text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out
