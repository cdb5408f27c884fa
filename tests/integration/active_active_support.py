"""Three active-active router replicas on a real etcd cluster, simulated engines, client load.

Every process is started on free loopback ports and stopped by PID through ``proc_group``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support import loopback
from tests.support.fleet import SimEngine, sim_stats, write_fleet
from tests.support.lifecycle import FAST, running_threads, wait_for
from tests.support.procs import ProcGroup
from tests.support.router import RouterHandle, start_router

LEASE_TTL = 2.0  # etcd's smallest lease with the test cluster's 1 s election timeout is 1.5 s
REPLICA_TTL = 2.0
RENEW = 0.5
LEASE = ["--lease-ttl", str(LEASE_TTL), "--lease-renew-interval", str(RENEW), "--lease-safety-margin", "0.5"]


def replica_args(endpoints: str, prefix: str, name: str) -> list[str]:
    return [
        "--ha-mode", "active-active",
        "--etcd-endpoints", endpoints,
        "--etcd-prefix", prefix,
        "--router-id", name,
        "--replica-ttl", str(int(REPLICA_TTL)),
        *LEASE,
    ]  # fmt: skip


def start_replica(
    group: ProcGroup,
    tmp_path: Path,
    sims: Sequence[SimEngine],
    endpoints: str,
    prefix: str,
    name: str,
    fleet: Path | None = None,
) -> RouterHandle:
    fleet = fleet or write_fleet(
        tmp_path, sims, name=f"{name}.fleet.json", state_path=str(tmp_path / f"{name}.state.json"), extra=FAST
    )
    return start_router(group, fleet, tmp_path, replica_args(endpoints, prefix, name), name=name)


def replica_id(r: RouterHandle) -> str:
    """The ``--router-id`` a replica was started with (its journal is named after it)."""
    return r.journal.name.split(".")[0]


def lifecycle(r: RouterHandle) -> dict[str, Any]:
    doc: dict[str, Any] = r.get("/narwhal/lifecycle").json()
    return doc


def holder_of(replicas: Sequence[RouterHandle]) -> RouterHandle | None:
    """The one replica whose lifecycle document says it controls the fleet (None: none or several)."""
    found = []
    for r in replicas:
        try:
            if lifecycle(r)["router"]["controls_fleet"]:
                found.append(r)
        except (httpx.HTTPError, ValueError):
            continue
    return found[0] if len(found) == 1 else None


def wait_serving(replicas: Sequence[RouterHandle], timeout: float = 60.0) -> RouterHandle:
    """Every replica /ready 200 and exactly one controls; returns the holder."""
    wait_for(
        "every replica ready",
        lambda: all(r.get("/ready").status_code == 200 for r in replicas),
        timeout=timeout,
    )
    holder = wait_for("exactly one holder", lambda: holder_of(replicas), timeout=timeout)
    assert isinstance(holder, RouterHandle)
    return holder


def legs(sim: SimEngine) -> int:
    """Legs the engine itself received (prefill + decode requests), from its own counters."""
    s = sim_stats(sim.url)
    return int(s["requests"]["prefill"]) + int(s["requests"]["decode"])


@dataclass
class ReplicaLoad:
    """Bounded client load spread over the replicas (round robin, no retries: a failure counts)."""

    urls: list[str]
    ok: dict[str, int] = field(default_factory=dict)
    failed: dict[str, list[str]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def total_ok(self) -> int:
        with self.lock:
            return sum(self.ok.values())

    def failures(self, urls: Sequence[str] | None = None) -> list[str]:
        with self.lock:
            return [f for u, fs in self.failed.items() if urls is None or u in urls for f in fs]


@contextmanager
def replica_load(urls: list[str], workers: int = 6, max_requests: int = 20_000) -> Iterator[ReplicaLoad]:
    load = ReplicaLoad(list(urls))
    budget = [max_requests]

    def worker(i: int) -> None:
        n = i
        with loopback.client(timeout=30) as client:
            while not load.stop.is_set():
                with load.lock:
                    if budget[0] <= 0:
                        return
                    budget[0] -= 1
                url = load.urls[n % len(load.urls)]
                n += 1
                stream = n % 2 == 0
                body = {"model": "sim-model", "prompt": f"load {i} {n}", "max_tokens": 8, "stream": stream}
                try:
                    r = client.post(url + "/v1/completions", json=body)
                    good = r.status_code == 200 and ("[DONE]" in r.text if stream else True)
                    why = "" if good else f"{r.status_code} {r.text[:160]}"
                except httpx.HTTPError as exc:
                    good, why = False, repr(exc)
                with load.lock:
                    if good:
                        load.ok[url] = load.ok.get(url, 0) + 1
                    else:
                        load.failed.setdefault(url, []).append(why)
                if not good:
                    time.sleep(0.05)

    with running_threads(worker, workers, load.stop, join_timeout=60):
        yield load


@dataclass
class LongStream:
    """One long streaming completion through one replica, read in a thread until it ends."""

    url: str
    max_tokens: int = 4000
    done: threading.Event = field(default_factory=threading.Event)
    ended_at: float = 0.0
    status: int = 0
    text: str = ""
    thread: threading.Thread | None = None

    def start(self) -> LongStream:
        def run() -> None:
            body = {"model": "sim-model", "prompt": "long", "max_tokens": self.max_tokens, "stream": True}
            try:
                with loopback.stream("POST", self.url + "/v1/completions", json=body, timeout=120) as r:
                    self.status = r.status_code
                    self.text = "".join(r.iter_text())
            except httpx.HTTPError as exc:
                self.text = repr(exc)
            finally:
                self.ended_at = time.monotonic()
                self.done.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        return self


def replica_resident(holder: RouterHandle, replica_id: str) -> dict[str, dict[str, int]]:
    """What the holder's document shows as resident per engine for one replica."""
    for m in lifecycle(holder)["replicas"]["members"]:
        if m["id"] == replica_id:
            resident: dict[str, dict[str, int]] = m["resident"]
            return resident
    return {}
