"""How the router core's control-plane work grows with fleet size (in-process, no engine processes).

At each fleet size N (default 16, 64, 256, 1024) a ``narwhal.fleet`` v2 document with N engines
pointing at unused loopback ports is parsed (``router.config.parse_fleet``) into a
``RouterCore`` with a ``Breaker`` and a ``LifecycleService`` (the objects ``narwhal-serve`` builds),
put in a realistic state (every engine's process identity recorded, one engine drained, N/16
ejected, a full event ring, random resident work), and timed:

* ``lifecycle_doc``  — ``GET /narwhal/lifecycle`` body: ``build_document`` + ``to_json`` + orjson
* ``handoff_doc``    — ``GET /narwhal/handoff`` body: ``router.ha.transfer.build`` + dump + orjson
* ``pick``           — one placement: ``scheduler.pick("prefill")`` + ``pick("decode")``
* ``breaker``        — one failure + one success recorded (no decision) and one eject/readmit pair
                       (the eject decision checks ``sole_server``)
* ``build_core``     — parse the fleet file + build core, breaker, lifecycle (startup cost)

Memory: tracemalloc peak while building each document, and the retained size of the core.

``--restart N`` additionally runs a rolling restart of N simulated engines end to end through
``narwhal-supervisor`` + ``narwhal-serve`` + Temporal (dev server) + ``narwhal-worker`` +
``narwhal-restart start --wait`` and reports total and per-engine time.

    .venv/bin/python bench/scale.py
    .venv/bin/python bench/scale.py --restart 64
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import shlex
import signal
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import markdown_table
from fleet.chaos.cli import terminate
from fleet.chaos.stack import ChaosStack
from fleet.fleetgen import fleet_document
from router.breaker import Breaker
from router.config import parse_fleet
from router.core import RouterCore
from router.journal import Journal
from router.lifecycle.document import build_document
from router.lifecycle.service import LifecycleService

MODEL = "sim-model"


def fleet_doc(n: int, tmp: Path) -> dict[str, Any]:
    # ports 1..n on 127.0.0.1: privileged and unused (nothing connects in-process anyway)
    engines = [
        (f"e{i:04d}", f"http://127.0.0.1:{10000 + i}", "prefill" if i < n // 2 else "decode")
        for i in range(n)
    ]
    return fleet_document(engines, model=MODEL, state_path=str(tmp / "state.json"))


def build(n: int, tmp: Path) -> tuple[RouterCore, Breaker, LifecycleService]:
    config = parse_fleet(fleet_doc(n, tmp))
    core = RouterCore(config=config, journal=Journal(None))
    breaker = Breaker(core.scheduler, core.clock, config.recovery.eject_after, emit=core.journal.append)
    service = LifecycleService(core, eject=breaker.eject)
    service.machine.readmit_hook = lambda iid: breaker.readmit(iid, "lifecycle")
    return core, breaker, service


def populate(core: RouterCore, breaker: Breaker, service: LifecycleService, seed: int = 0) -> None:
    rng = random.Random(seed)
    machine = service.machine
    ids = sorted(core.scheduler.engines)
    now = core.clock.wall()
    for iid in ids:
        machine.process_starts[iid] = now - rng.uniform(100, 10000)
        eng = core.scheduler.engines[iid]
        eng.resident_prefill = rng.randint(0, 8) if eng.role == "prefill" else 0
        eng.resident_decode = rng.randint(0, 32) if eng.role == "decode" else 0
    for iid in ids[1 : len(ids) // 2 : 16]:
        breaker.eject(iid, "connection")
    machine.begin([ids[-1]], wave=False, deadline_s=300)
    machine.record_old_identity(ids[-1], machine.process_starts[ids[-1]])
    for i in range(400):  # fill the event ring
        machine.emit("bench_event", iid=ids[i % len(ids)], n=i)


def timeit(fn: Callable[[], object], min_time: float = 0.5, min_iters: int = 5) -> float:
    """CPU seconds per call (``time.process_time``, so time the process spends preempted by other
    load on a shared machine does not count): the fastest of several ~50 ms batches."""
    fn()
    t0 = time.process_time()
    for _ in range(3):
        fn()
    one = max((time.process_time() - t0) / 3, 1e-7)
    batch = max(1, int(0.05 / one))
    per: list[float] = []
    start = time.perf_counter()
    while len(per) < min_iters or time.perf_counter() - start < min_time:
        t = time.process_time()
        for _ in range(batch):
            fn()
        per.append((time.process_time() - t) / batch)
    return min(per)


def peak_kib(fn: Callable[[], object]) -> tuple[float, int]:
    """tracemalloc peak (KiB) during one call, and the size of what it returned (bytes, if bytes)."""
    gc.collect()
    tracemalloc.start()
    out = fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 1024, len(out) if isinstance(out, bytes) else 0


def measure(n: int, tmp: Path) -> dict[str, float]:
    from router.ha import transfer

    def startup() -> object:
        return build(n, tmp)

    build_s = timeit(startup, min_time=0.5, min_iters=3)
    gc.collect()
    tracemalloc.start()
    core, breaker, service = build(n, tmp)
    core_kib = tracemalloc.get_traced_memory()[0] / 1024
    tracemalloc.stop()
    populate(core, breaker, service)

    def lifecycle_doc() -> bytes:
        return orjson.dumps(build_document(service.machine, core).to_json())

    def handoff_doc() -> bytes:
        return orjson.dumps(transfer.build(core, service).dump())

    sched = core.scheduler

    def pick() -> object:
        return sched.pick("prefill"), sched.pick("decode")

    victim = sorted(sched.engines)[2]

    def breaker_record() -> None:
        breaker.record_failure(victim, "timeout")
        breaker.record_success(victim, "decode")

    def eject_readmit() -> None:
        breaker.eject(victim, "connection")
        breaker.readmit(victim, "health")

    out: dict[str, float] = {"engines": n, "build_core_ms": build_s * 1e3, "core_kib": core_kib}
    for name, fn in (("lifecycle_doc", lifecycle_doc), ("handoff_doc", handoff_doc)):
        out[f"{name}_ms"] = timeit(fn) * 1e3
        out[f"{name}_peak_kib"], size = peak_kib(fn)
        out[f"{name}_bytes"] = size
    out["pick_us"] = timeit(pick) * 1e6
    out["breaker_record_us"] = timeit(breaker_record) * 1e6
    out["eject_readmit_us"] = timeit(eject_readmit) * 1e6
    return out


def growth(rows: list[dict[str, float]], key: str) -> str:
    """Exponent k of time ∝ N^k between the smallest and the largest fleet."""
    import math

    a, b = rows[0], rows[-1]
    if a[key] <= 0 or b[key] <= 0 or a["engines"] == b["engines"]:
        return "—"
    return f"{math.log(b[key] / a[key]) / math.log(b['engines'] / a['engines']):.2f}"


def core_report(rows: list[dict[str, float]]) -> str:
    cols = [
        ("build_core_ms", "startup ms", 2),
        ("core_kib", "core KiB", 0),
        ("lifecycle_doc_ms", "lifecycle doc ms", 3),
        ("lifecycle_doc_peak_kib", "lifecycle peak KiB", 0),
        ("lifecycle_doc_bytes", "lifecycle bytes", 0),
        ("handoff_doc_ms", "handoff doc ms", 3),
        ("handoff_doc_peak_kib", "handoff peak KiB", 0),
        ("handoff_doc_bytes", "handoff bytes", 0),
        ("pick_us", "pick µs (prefill+decode)", 2),
        ("breaker_record_us", "breaker fail+success µs", 2),
        ("eject_readmit_us", "eject+readmit µs", 2),
    ]
    headers = ["engines", *[c[1] for c in cols]]
    body = [[str(int(r["engines"])), *[f"{r[k]:.{d}f}" for k, _, d in cols]] for r in rows]
    body.append(["growth k (t ∝ Nᵏ)", *[growth(rows, k) for k, _, _ in cols]])
    return markdown_table(headers, body)


# -- rolling restart timing (--restart N): the chaos drill's stack, one restart, no faults ------------------------------------------------------


async def _timed_restart(stack: ChaosStack, n: int, mode: str, timeout_s: float) -> dict[str, Any]:
    try:
        return await _timed_restart_on(stack, n, mode, timeout_s)
    finally:
        await stack.close()


async def _timed_restart_on(stack: ChaosStack, n: int, mode: str, timeout_s: float) -> dict[str, Any]:
    t_up = time.monotonic()
    await stack.bring_up()
    up_s = time.monotonic() - t_up
    args = [a if a != "rolling" else mode for a in stack.restart_args()] + ["--wait"]
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    timed_out = False
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        timed_out = True
        proc.kill()  # by PID (the CLI only waits; the workflow keeps its state in Temporal)
        out, _ = await proc.communicate()
    total = time.monotonic() - t0
    sup = await stack.supervisor_engines()
    return {
        "bring_up_s": up_s,
        "total_s": total,
        "timed_out": timed_out,
        "rc": proc.returncode,
        "output": out.decode(errors="replace"),
        "supervisor_restarts": sum(int(e.get("restarts", 0)) for e in sup.values()),
        "per_engine": journal_restart_times(stack.tmp),
    }


def journal_restart_times(tmp: Path) -> dict[str, dict[str, float | None]]:
    """Per engine: seconds from ``drain_started`` to ``readmitted`` (None: never readmitted), from
    both routers' journals."""
    start: dict[str, float] = {}
    done: dict[str, float] = {}
    for path in sorted(tmp.glob("journal-*.jsonl")):
        for line in path.read_text().splitlines():
            if '"engine_lifecycle"' not in line:
                continue
            row = json.loads(line)
            iid, action = row.get("iid"), row.get("action")
            if action == "drain_started" and iid:
                start[iid] = min(start.get(iid, row["at"]), row["at"])
            elif action == "readmitted" and iid:
                done[iid] = max(done.get(iid, row["at"]), row["at"])
    return {
        iid: {"drain_at": t, "seconds": (done[iid] - t) if iid in done else None} for iid, t in start.items()
    }


def rolling_restart_timing(n: int, mode: str = "rolling", timeout_s: float = 900.0) -> str:
    """Bring up the stack with ``n`` sims, run one restart with ``--wait`` (bounded by ``timeout_s``),
    report total and per-engine time (markdown)."""
    with tempfile.TemporaryDirectory(prefix="scale-restart.") as tmpdir:
        stack = ChaosStack(Path(tmpdir), n, {"ttft_base_ms": 2.0, "itl_ms": 1.0, "max_concurrency": 256})
        try:
            res = asyncio.run(_timed_restart(stack, n, mode, timeout_s))
        finally:
            stack.close_now()
    per = res["per_engine"]
    secs = sorted(v["seconds"] for v in per.values() if v["seconds"] is not None)
    stuck = sorted(iid for iid, v in per.items() if v["seconds"] is None)
    lines = [
        f"Rolling restart ({mode}) of {n} simulated engines end to end "
        f"(supervisor + HA router pair + Temporal dev server + worker, `narwhal-restart start --wait`):",
        "",
        f"- stack bring-up: {res['bring_up_s']:.1f} s",
        f"- restart: {res['total_s']:.1f} s {'(TIMED OUT) ' if res['timed_out'] else ''}"
        f"exit {res['rc']}; {len(secs)} of {n} engines readmitted, supervisor restarts {res['supervisor_restarts']}",
    ]
    if secs:
        lines.append(
            f"- per engine (drain → readmitted): median {statistics.median(secs):.1f} s, "
            f"min {secs[0]:.1f} s, max {secs[-1]:.1f} s; {res['total_s'] / max(1, len(secs)):.2f} s of wall time per engine"
        )
    if stuck:
        lines.append(f"- drained but never readmitted: {', '.join(stuck)}")
    lines += ["", "```", res["output"].strip()[-3000:], "```"]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[16, 64, 256, 1024])
    ap.add_argument("--restart", type=int, default=0, help="also run a rolling restart of this many sims")
    ap.add_argument("--restart-mode", default="rolling", choices=["rolling", "wave"])
    ap.add_argument("--restart-timeout", type=float, default=900.0, help="bound on the restart (s)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, terminate)  # children are stopped by PID on the way out
    text = f"Command: `{shlex.join(['python', *sys.argv])}`\n\n"
    with tempfile.TemporaryDirectory(prefix="scale.") as tmpdir:
        rows = []
        for n in a.sizes:
            rows.append(measure(n, Path(tmpdir)))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    text += core_report(rows) + "\n"
    if a.restart:
        res = rolling_restart_timing(a.restart, a.restart_mode, a.restart_timeout)
        text += "\n" + res + "\n"
    sys.stdout.write(text)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
