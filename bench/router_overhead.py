"""Router overhead: the same closed-loop streaming load, without and with the router.

Targets (``--targets``, default ``direct,direct-pd,router``), each with ``--concurrency`` workers
sending ``--requests`` streamed completions with a fixed prompt, over loopback only (all processes
started here and stopped by PID):

* ``direct``      — straight to one simulated engine (no PD split: one leg).
* ``direct-pd``   — the client itself runs the PD split over two sims (prefill on A, decode on B
                    with the descriptor) — the same engine work the router does.
* ``router``      — through ``narwhal-serve`` (PD split over the same two sims).
* ``vllm-router`` — through the Rust ``vllm-router`` (``--vllm-pd-disaggregation``, nixl,
                    round robin) over the same two sims, for comparison.

Router overhead = router − direct-pd (same legs, same engines); ``direct`` is shown for scale.
CPU per request: user+system time of the router process (``/proc/<pid>/stat``, all threads) over
the measured run ÷ requests; ``sims cpu`` is the same for the two engine simulators together and
``gen cpu`` for this load generator; ``rtr/sims`` (router over sims CPU, same requests) is less
sensitive to what else the machine is running than either alone. Everything shares the machine's cores, so router CPU per
request is the number that decides how much it slows the rest down.

    .venv/bin/python bench/router_overhead.py --requests 2000 --concurrency 50
    .venv/bin/python bench/router_overhead.py --targets direct-pd,router,vllm-router --concurrency 64 --rounds 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleet.fleetgen import sim_command
from narwhal_testing.fleet import vllm_router_command
from narwhal_testing.procs import free_port, proc_group, script, wait_http

MODEL = "sim-model"
TARGETS = ("direct", "direct-pd", "router", "vllm-router")
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    return (int(fields[11]) + int(fields[12])) / _TICK


async def _stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[float, float]:
    t0 = time.perf_counter()
    ttft = 0.0
    async with session.post(url + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.read())[:200]!r}")
        async for line in resp.content:
            if line.startswith(b"data: ") and not ttft:
                ttft = time.perf_counter() - t0
            if line.startswith(b"data: [DONE]"):
                break
    return ttft, time.perf_counter() - t0


async def _direct_pd(
    session: aiohttp.ClientSession, a: str, b: str, body: dict[str, Any]
) -> tuple[float, float]:
    t0 = time.perf_counter()
    pre = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
    async with session.post(a + "/v1/completions", json=pre) as resp:
        doc = orjson.loads(await resp.read())
    desc = doc.get("kv_transfer_params") or doc["choices"][0]["kv_transfer_params"]
    dec = {**body, "stream": True, "return_token_ids": True, "stream_interval": 1, "kv_transfer_params": desc}
    ttft, e2e = await _stream(session, b, dec)
    return ttft + (time.perf_counter() - t0 - e2e), time.perf_counter() - t0


async def run_load(
    kind: str,
    urls: list[str],
    n: int,
    concurrency: int,
    max_tokens: int,
    router_pid: int | None = None,
    sim_pids: tuple[int, ...] = (),
) -> dict[str, Any]:
    """One measured run: raw latencies and the CPU each process used (see ``summarize``)."""
    body = {
        "model": MODEL,
        "prompt": "the quick brown narwhal jumps over the lazy walrus",
        "max_tokens": max_tokens,
        "stream": True,
    }
    lat: list[float] = []
    ttfts: list[float] = []
    todo = iter(range(n))
    connector = aiohttp.TCPConnector(limit=concurrency * 2)

    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            for _ in todo:
                if kind == "direct-pd":
                    ttft, e2e = await _direct_pd(session, urls[0], urls[1], body)
                else:
                    ttft, e2e = await _stream(session, urls[0], body)
                ttfts.append(ttft)
                lat.append(e2e)

        # warm-up (connections, caches), not measured
        await asyncio.gather(
            *(
                _stream(session, urls[0], body)
                if kind != "direct-pd"
                else _direct_pd(session, urls[0], urls[1], body)
                for _ in range(concurrency)
            )
        )
        cpu0 = cpu_seconds(router_pid) if router_pid else 0.0
        sims0 = sum(cpu_seconds(p) for p in sim_pids)
        gen0 = time.process_time()
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
        gen = time.process_time() - gen0
        cpu = (cpu_seconds(router_pid) - cpu0) if router_pid else 0.0
        sims = sum(cpu_seconds(p) for p in sim_pids) - sims0
    return {"lat": lat, "ttft": ttfts, "wall": wall, "cpu": cpu, "sims": sims, "gen": gen}


def summarize(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Pool the rounds of one target: latencies together, wall and CPU time summed."""
    lat = [x for r in runs for x in r["lat"]]
    ttfts = [x for r in runs for x in r["ttft"]]
    n = len(lat)
    wall, cpu = sum(r["wall"] for r in runs), sum(r["cpu"] for r in runs)
    sims, gen = sum(r["sims"] for r in runs), sum(r["gen"] for r in runs)
    q = statistics.quantiles(lat, n=100)
    qt = statistics.quantiles(ttfts, n=100)
    return {
        "rps": n / wall,
        "p50_ms": q[49] * 1e3,
        "p99_ms": q[98] * 1e3,
        "ttft_p50_ms": qt[49] * 1e3,
        "ttft_p99_ms": qt[98] * 1e3,
        "router_cpu_ms": cpu / n * 1e3,
        "router_cpu_util": cpu / wall,
        "sims_cpu_ms": sims / n * 1e3,
        "gen_cpu_ms": gen / n * 1e3,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--itl-ms", type=float, default=1.0)
    ap.add_argument("--ttft-base-ms", type=float, default=2.0)
    ap.add_argument(
        "--targets",
        default="direct,direct-pd,router",
        help=f"comma-separated, run in this order; any of {', '.join(TARGETS)}",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="split --requests into this many rounds, cycling through the targets each round, so "
        "load from anything else on the machine lands on every target alike",
    )
    ap.add_argument(
        "--hold",
        type=float,
        default=0.0,
        help="seconds to keep the load running on `router` for a profiler (prints the router PID)",
    )
    a = ap.parse_args()
    targets = [t.strip() for t in a.targets.split(",") if t.strip()]
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown:
        ap.error(f"unknown targets: {', '.join(unknown)}")
    print("command:", shlex.join([sys.executable, *sys.argv]))
    sim_opts = {"itl_ms": a.itl_ms, "ttft_base_ms": a.ttft_base_ms, "max_concurrency": 1024}
    with tempfile.TemporaryDirectory() as tmpdir, proc_group(Path(tmpdir)) as group:
        tmp = Path(tmpdir)
        sims = []
        for i in range(2):
            port = free_port()
            proc = group.start(f"e{i}", sim_command(f"e{i}", port, MODEL, **sim_opts))
            sims.append(f"http://127.0.0.1:{port}")
            wait_http(sims[-1] + "/health", proc=proc)
        fleet = {
            "schema": "narwhal.fleet",
            "schema_version": 2,
            "model": MODEL,
            "engines": [
                {"iid": "e0", "url": sims[0], "role": "prefill"},
                {"iid": "e1", "url": sims[1], "role": "decode"},
            ],
            "recovery": {"state_path": str(tmp / "state.json"), "liveness_every": 0},
        }
        (tmp / "fleet.json").write_text(json.dumps(fleet))
        rport = free_port()
        router_proc = group.start(
            "router",
            [
                script("narwhal-serve"),
                "--fleet",
                str(tmp / "fleet.json"),
                "--port",
                str(rport),
                "--journal",
                str(tmp / "journal.jsonl"),
                "--log-level",
                "warning",
            ],
        )
        router = f"http://127.0.0.1:{rport}"
        wait_http(router + "/ready", proc=router_proc)
        vproc = None
        if "vllm-router" in targets:
            vport = free_port()
            vproc = group.start("vllm-router", vllm_router_command(sims[:1], sims[1:2], vport, tmp))
            wait_http(f"http://127.0.0.1:{vport}/health", timeout=30, proc=vproc)
        sim_pids = tuple(p.pid for p in group.procs[:2])
        plans: dict[str, tuple[list[str], int | None]] = {
            "direct": ([sims[1]], None),
            "direct-pd": (sims, None),
            "router": ([router], router_proc.pid),
            "vllm-router": ([f"http://127.0.0.1:{vport}"], vproc.pid) if vproc else ([], None),
        }
        if a.hold > 0:
            print(f"router pid {router_proc.pid}: holding load for {a.hold:.0f}s", flush=True)
            n_hold = max(a.requests, int(a.hold * 2000))
            asyncio.run(run_load("router", [router], n_hold, a.concurrency, a.max_tokens))
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
        per_round = max(a.concurrency, a.requests // max(a.rounds, 1))
        for _ in range(max(a.rounds, 1)):
            for name in targets:
                urls, pid = plans[name]
                runs[name].append(
                    asyncio.run(run_load(name, urls, per_round, a.concurrency, a.max_tokens, pid, sim_pids))
                )
        results = {name: summarize(r) for name, r in runs.items()}
    print(
        f"{per_round * max(a.rounds, 1)} streamed requests per target ({max(a.rounds, 1)} rounds), "
        f"{a.concurrency} concurrent, {a.max_tokens} tokens, "
        f"sim itl {a.itl_ms} ms / ttft base {a.ttft_base_ms} ms, {os.cpu_count()} cpus"
    )
    print(
        f"{'target':11} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'ttft50':>8} {'ttft99':>8} "
        f"{'rtr cpu ms/req':>15} {'rtr util':>9} {'sims cpu':>9} {'gen cpu':>8} {'rtr/sims':>8}"
    )
    for name, r in results.items():
        print(
            f"{name:11} {r['rps']:8.1f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['ttft_p50_ms']:8.2f} "
            f"{r['ttft_p99_ms']:8.2f} {r['router_cpu_ms']:15.3f} {r['router_cpu_util']:9.2f} "
            f"{r['sims_cpu_ms']:9.3f} {r['gen_cpu_ms']:8.3f} {r['router_cpu_ms'] / r['sims_cpu_ms']:8.3f}"
        )
    base = results.get("direct-pd")
    for name in ("router", "vllm-router"):
        rt = results.get(name)
        if base is None or rt is None:
            continue
        print(
            f"{name} vs direct-pd: added p50 {rt['p50_ms'] - base['p50_ms']:+.2f} ms "
            f"(ratio {rt['p50_ms'] / base['p50_ms']:.3f}), added p99 {rt['p99_ms'] - base['p99_ms']:+.2f} ms, "
            f"throughput ratio {rt['rps'] / base['rps']:.3f}, router cpu {rt['router_cpu_ms']:.3f} ms/req"
        )
    if "router" in results and "vllm-router" in results:
        r, v = results["router"], results["vllm-router"]
        print(
            f"router vs vllm-router: throughput ratio {r['rps'] / v['rps']:.3f}, "
            f"p50 {r['p50_ms'] - v['p50_ms']:+.2f} ms, cpu/req ratio "
            f"{r['router_cpu_ms'] / max(v['router_cpu_ms'], 1e-9):.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
