"""Active-active: aggregate throughput and router CPU per request for 1, 2 and 3 replicas, and the
propagation latency of the holder's commits (drains included) to every replica.

Same simulated engines for every replica count; a closed-loop streaming load split round robin over
the replicas (``--ha-mode active-active`` on a three-member etcd cluster of child processes).
Router CPU = user + system time of every replica process over the measured run ÷ requests.

Propagation: an observer watches the HA prefix in etcd; for every commit of ``<prefix>handoff``
(revision R: drains, readmissions and the periodic writes) it records when the event arrived and
when each other replica's membership key first reported ``applied_version >= R`` (that replica has
applied R to its placement). Reported: the time until the *last* replica did, p50 / p99 / max.

    .venv/bin/python bench/replicas.py [--replicas 1 2 3] [--duration 8] [--concurrency 24]
                                       [--drains 5] [--out bench/results/replicas.md]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._common import (  # noqa: E402
    SHORT_PROMPT,
    closed_loop,
    completion_body,
    markdown_table,
    pct,
    proc_cpu_s,
    run_async,
    stream_completion,
)
from narwhal_testing.etcd import EtcdCluster  # noqa: E402
from narwhal_testing.fleet import restart_sim, start_sims, write_fleet  # noqa: E402
from narwhal_testing.procs import ProcGroup, proc_group  # noqa: E402
from narwhal_testing.router import RouterHandle, start_router  # noqa: E402
from router.ha.etcd_client import EtcdClient, EtcdError, prefix_end  # noqa: E402

FAST = {"controller": {"monitor_interval_s": 0.2}}
LEASE = ["--lease-ttl", "2", "--lease-renew-interval", "0.5", "--lease-safety-margin", "0.5"]


def start_replicas(
    group: ProcGroup, work: Path, sims: Any, endpoints: str, prefix: str, n: int
) -> list[RouterHandle]:
    out = []
    for i in range(n):
        name = f"r{i}"
        fleet = write_fleet(work, sims, name=f"{prefix.strip('/').replace('/', '-')}-{name}.json",
                            state_path=str(work / f"{name}.{n}.state.json"), extra=FAST)  # fmt: skip
        args = ["--ha-mode", "active-active", "--etcd-endpoints", endpoints, "--etcd-prefix", prefix,
                "--router-id", name, *LEASE]  # fmt: skip
        out.append(start_router(group, fleet, work, args, name=f"{name}-{n}"))
    deadline = time.monotonic() + 60
    while not all(httpx.get(r.url + "/ready", timeout=5).status_code == 200 for r in out):
        if time.monotonic() > deadline:
            raise TimeoutError("replicas never all ready")
        time.sleep(0.1)
    return out


def holder(replicas: list[RouterHandle]) -> RouterHandle:
    for r in replicas:
        if httpx.get(r.url + "/narwhal/lifecycle", timeout=5).json()["router"]["controls_fleet"]:
            return r
    raise RuntimeError("no holder")


def throughput(
    replicas: list[RouterHandle], concurrency: int, duration: float, max_tokens: int
) -> dict[str, float]:
    body = completion_body(SHORT_PROMPT, max_tokens)
    urls = [r.url for r in replicas]
    pids = [r.proc.pid for r in replicas]
    cpu0: list[float] = []

    def measure() -> None:
        cpu0[:] = [proc_cpu_s(p) for p in pids]

    def send(session: Any, i: int) -> Any:
        return stream_completion(session, urls[i % len(urls)], body)

    res = run_async(closed_loop(send, concurrency, duration, on_measure=measure))
    cpu = sum(proc_cpu_s(p) for p in pids) - sum(cpu0)
    s = res.summary()
    n = max(1.0, s["requests"])
    return {**s, "router_cpu_ms": cpu / n * 1e3, "router_cpu_util": cpu / res.wall_s}


async def observe(
    endpoints: str, prefix: str, stop: asyncio.Event, out: list[tuple[int, float, dict[str, float]]]
) -> None:
    """Commit revision → (seen at, {replica: applied-reported at})."""
    client = EtcdClient(endpoints, timeout_s=2.0)
    key = prefix.encode()
    commits: dict[int, tuple[float, dict[str, float]]] = {}
    applied: dict[str, int] = {}
    try:

        async def run() -> None:
            async for ev in client.watch(key, range_end=prefix_end(key)):
                now = time.monotonic()
                name = ev.kv.key[len(key) :].decode()
                if name == "handoff" and ev.type == "PUT":
                    commits[ev.kv.mod_revision] = (now, {})
                elif name.startswith("replicas/") and ev.type == "PUT":
                    rid = name.removeprefix("replicas/")
                    version = int(orjson.loads(ev.kv.value)["applied_version"])
                    if version <= applied.get(rid, 0):
                        continue
                    applied[rid] = version
                    for rev, (_, seen) in commits.items():
                        if rev <= version and rid not in seen:
                            seen[rid] = now

        task = asyncio.create_task(run())
        await stop.wait()
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, EtcdError):
            pass
    finally:
        await client.aclose()
    out.extend((rev, at, seen) for rev, (at, seen) in sorted(commits.items()))


def propagation(group: ProcGroup, endpoints: str, prefix: str, replicas: list[RouterHandle], sims: Any,
                seconds: float, drains: int) -> dict[str, Any]:  # fmt: skip
    out: list[tuple[int, float, dict[str, float]]] = []
    drain_revs: list[int] = []

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(observe(endpoints, prefix, stop, out))
        await asyncio.sleep(seconds)  # periodic commits (monitor pass every 0.2 s)
        h = holder(replicas)
        async with httpx.AsyncClient(timeout=60) as http:
            for k in range(drains):
                sim = sims[k % len(sims)]
                r = await http.post(h.url + "/narwhal/lifecycle/drain", json={"engines": [sim.iid]})
                if r.status_code != 200:
                    raise RuntimeError(f"drain {sim.iid}: {r.status_code} {r.text[:200]}")
                kv = await http.get(h.url + "/narwhal/lifecycle")
                drain_revs.append(int(kv.json()["replicas"]["version"]))
                await asyncio.to_thread(restart_sim, group, sim)
                r = await http.post(h.url + "/narwhal/lifecycle/readmit", json={"engines": [sim.iid]})
                if r.status_code != 200:
                    raise RuntimeError(f"readmit {sim.iid}: {r.status_code} {r.text[:200]}")
        await asyncio.sleep(1.0)
        stop.set()
        await task

    asyncio.run(main())
    followers = len(replicas) - 1
    full = [(rev, max(seen.values()) - at) for rev, at, seen in out if len(seen) >= followers]
    lat = [d for _, d in full]
    marks = set(drain_revs)  # the version the holder was at right after each drain's 200
    drained = [d for rev, d in full if rev in marks]
    return {
        "commits": len(out),
        "complete": len(full),
        "p50_ms": pct(lat, 50) * 1e3,
        "p99_ms": pct(lat, 99) * 1e3,
        "max_ms": max(lat, default=0.0) * 1e3,
        "drains": len(drain_revs),
        "drain_max_ms": max(drained, default=0.0) * 1e3,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=24)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--itl-ms", type=float, default=1.0)
    ap.add_argument("--propagation-s", type=float, default=10.0)
    ap.add_argument("--drains", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="replicas.") as tmp, proc_group(Path(tmp)) as group:
        work = Path(tmp)
        cluster = EtcdCluster(work / "etcd")
        try:
            cluster.start_all()
            sims = start_sims(group, a.engines, itl_ms=a.itl_ms)
            prop: dict[str, Any] = {}
            for n in a.replicas:
                prefix = f"/narwhal-bench/n{n}-{os.getpid()}/"
                replicas = start_replicas(group, work, sims, cluster.endpoints, prefix, n)
                res = throughput(replicas, a.concurrency, a.duration, a.max_tokens)
                rows.append((n, res))
                print(f"{n} replica(s): {res['rps']:.0f} req/s, {res['router_cpu_ms']:.3f} router CPU ms/req, "
                      f"errors {res['errors']:.0f}", flush=True)  # fmt: skip
                if n == max(a.replicas) and n > 1:
                    prop = propagation(
                        group, cluster.endpoints, prefix, replicas, sims, a.propagation_s, a.drains
                    )
                    print(f"propagation: {prop}", flush=True)
                for r in replicas:
                    r.proc.stop()
        finally:
            cluster.close()
    base = rows[0][1]["rps"] if rows else 1.0
    table = markdown_table(
        ["replicas", "req/s", "vs 1", "p50 ms", "p99 ms", "router CPU ms/req", "router CPU util", "errors"],
        [(str(n), f"{r['rps']:.0f}", f"{r['rps'] / base:.2f}×", f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}",
          f"{r['router_cpu_ms']:.3f}", f"{r['router_cpu_util']:.2f}", f"{r['errors']:.0f}") for n, r in rows],
    )  # fmt: skip
    cmd = "python bench/replicas.py " + " ".join(sys.argv[1:])
    report = [
        f"`{cmd.strip()}` — {os.cpu_count()} CPUs shared by the load generator, every replica, "
        f"{a.engines} simulated engines (itl {a.itl_ms} ms) and a 3-member etcd; concurrency "
        f"{a.concurrency}, {a.max_tokens} tokens per streamed request, {a.duration:g} s per point.",
        "",
        table,
    ]
    if prop:
        report += [
            "",
            f"Commit → applied on every replica ({max(a.replicas)} replicas, {prop['complete']} of "
            f"{prop['commits']} commits, {prop['drains']} drain/restart/readmit cycles among them): "
            f"p50 {prop['p50_ms']:.1f} ms, p99 {prop['p99_ms']:.1f} ms, max {prop['max_ms']:.1f} ms; "
            f"slowest drain commit {prop['drain_max_ms']:.1f} ms.",
        ]
    text = "\n".join(report) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
