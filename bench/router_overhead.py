"""Router overhead: the same closed-loop streaming load, without and with the router.

Three targets, each with ``--concurrency`` workers sending ``--requests`` streamed completions with a
fixed prompt, over loopback only (all processes started here and stopped by PID):

* ``direct``    — straight to one simulated engine (no PD split: one leg).
* ``direct-pd`` — the client itself runs the PD split over two sims (prefill on A, decode on B
                  with the descriptor) — the same engine work the router does.
* ``router``    — through ``narwhal-serve`` (PD split over the same two sims).

Router overhead = router − direct-pd (same legs, same engines); ``direct`` is shown for scale.

    .venv/bin/python bench/router_overhead.py --requests 2000 --concurrency 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
from tests.support.procs import free_port, proc_group, script, wait_http

MODEL = "sim-model"


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


async def run_load(kind: str, urls: list[str], n: int, concurrency: int, max_tokens: int) -> dict[str, float]:
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
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    q = statistics.quantiles(lat, n=100)
    qt = statistics.quantiles(ttfts, n=100)
    return {
        "rps": n / wall,
        "p50_ms": q[49] * 1e3,
        "p99_ms": q[98] * 1e3,
        "ttft_p50_ms": qt[49] * 1e3,
        "ttft_p99_ms": qt[98] * 1e3,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--itl-ms", type=float, default=1.0)
    ap.add_argument("--ttft-base-ms", type=float, default=2.0)
    a = ap.parse_args()
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
        results = {
            "direct": asyncio.run(run_load("direct", [sims[1]], a.requests, a.concurrency, a.max_tokens)),
            "direct-pd": asyncio.run(run_load("direct-pd", sims, a.requests, a.concurrency, a.max_tokens)),
            "router": asyncio.run(run_load("router", [router], a.requests, a.concurrency, a.max_tokens)),
        }
    print(
        f"{a.requests} streamed requests, {a.concurrency} concurrent, {a.max_tokens} tokens, "
        f"sim itl {a.itl_ms} ms / ttft base {a.ttft_base_ms} ms"
    )
    print(f"{'target':10} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'ttft50':>8} {'ttft99':>8}")
    for name, r in results.items():
        print(
            f"{name:10} {r['rps']:8.1f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['ttft_p50_ms']:8.2f} "
            f"{r['ttft_p99_ms']:8.2f}"
        )
    base, rt = results["direct-pd"], results["router"]
    print(
        f"router vs direct-pd: added p50 {rt['p50_ms'] - base['p50_ms']:+.2f} ms "
        f"(ratio {rt['p50_ms'] / base['p50_ms']:.3f}), added p99 {rt['p99_ms'] - base['p99_ms']:+.2f} ms, "
        f"throughput ratio {rt['rps'] / base['rps']:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
