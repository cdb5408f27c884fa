"""Side-by-side PD routers on the same simulated engines and the same load.

One set of engines (2 prefill + 2 decode ``narwhal-engine-sim``, fixed latency model) serves every
system, started once; every system runs at the same time (idle when not measured) so runs can be
interleaved: for each repetition, for each (prompt, concurrency), each system in a rotated order.

Systems:

* ``direct-pd``  — the floor: the load generator runs the vLLM/NIXL PD split itself
                   (prefill with ``do_remote_decode`` → decode stream with the descriptor).
* ``narwhal``    — ``narwhal-serve`` (this repo).
* ``vllm-router``— ``vllm-router --vllm-pd-disaggregation --kv-connector nixl --policy round_robin``.
* ``sglang-router`` is not run: it cannot drive a vLLM-dialect PD fleet (see docs/benchmarks.md).

Pinning: the load generator on the first CPU, routers + engines (via ``taskset``) on the rest.
Router CPU per request = Δ(utime+stime) of the router PID over a run ÷ requests completed.

    .venv/bin/python bench/pd_routers.py                 # full matrix (~10 min)
    .venv/bin/python bench/pd_routers.py --quick         # smoke (a few seconds per system)
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import (
    LONG_PROMPT,
    MODEL,
    PROMPT_2K,
    PROMPT_8K,
    SHORT_PROMPT,
    Pinning,
    Spread,
    _cpus,
    closed_loop,
    completion_body,
    direct_pd_sender,
    markdown_table,
    proc_cpu_s,
    proc_sys_cpu_s,
    router_sender,
    run_async,
)
from fleet.fleetgen import fleet_document, sim_command
from narwhal_testing.fleet import vllm_router_command
from narwhal_testing.procs import BIN, Proc, ProcGroup, free_port, proc_group, script, wait_http

PROMPTS = {"short": SHORT_PROMPT, "2k": PROMPT_2K, "8k": PROMPT_8K, "long": LONG_PROMPT}


BASELINE = "narwhal-base"


def workload(name: str, max_tokens: int) -> tuple[str, int]:
    """``short`` / ``long`` (prompt, ``--max-tokens`` output) or ``<prompt>-<N>`` (N output tokens)."""
    prompt, _, n = name.partition("-")
    return PROMPTS[prompt], int(n) if n else max_tokens


@dataclass
class System:
    name: str
    proc: Proc | None  # the router process (None for the direct client)
    make_sender: Callable[[dict[str, Any]], Callable[..., Any]]


def start_engines(
    group: ProcGroup, pin: Pinning, sim_opts: dict[str, Any], procs: list[Proc] | None = None
) -> tuple[list[str], list[str]]:
    urls: list[str] = []
    procs = procs if procs is not None else []
    for i in range(4):
        port = free_port()
        procs.append(group.start(f"e{i}", pin.server_cmd(sim_command(f"e{i}", port, MODEL, **sim_opts))))
        urls.append(f"http://127.0.0.1:{port}")
    for url, proc in zip(urls, procs, strict=True):
        wait_http(url + "/health", proc=proc)
    return urls[:2], urls[2:]


def start_narwhal(
    group: ProcGroup,
    pin: Pinning,
    tmp: Path,
    prefills: list[str],
    decodes: list[str],
    name: str = "narwhal",
    exe: str = "",
    extra: dict[str, Any] | None = None,
) -> System:
    """``narwhal-serve`` of this checkout, or ``exe`` (another checkout's, for a before/after)."""
    engines = [(f"e{i}", u, "prefill") for i, u in enumerate(prefills)]
    engines += [(f"e{i + 2}", u, "decode") for i, u in enumerate(decodes)]
    doc = fleet_document(engines, model=MODEL, state_path=str(tmp / f"{name}.state.json"), extra=extra)
    (tmp / f"{name}.fleet.json").write_text(json.dumps(doc, indent=2))
    port = free_port()
    cmd = [
        exe or script("narwhal-serve"),
        *("--fleet", str(tmp / f"{name}.fleet.json"), "--host", "127.0.0.1", "--port", str(port)),
        *("--journal", str(tmp / f"{name}.journal.jsonl"), "--log-level", "warning"),
    ]
    proc = group.start(name, pin.server_cmd(cmd))
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/ready", timeout=30, proc=proc)
    return System(name, proc, lambda body: router_sender(url, body))


def start_vllm_router(
    group: ProcGroup, pin: Pinning, tmp: Path, prefills: list[str], decodes: list[str]
) -> System:
    port = free_port()
    cmd = vllm_router_command(prefills, decodes, port, tmp, "--log-level", "warning")
    proc = group.start("vllm-router", pin.server_cmd(cmd))
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", timeout=30, proc=proc)
    return System("vllm-router", proc, lambda body: router_sender(url, body))


def run_matrix(a: argparse.Namespace) -> dict[str, Any]:
    pin = Pinning.default()
    sim_opts = {
        "ttft_base_ms": a.ttft_base_ms,
        "ttft_per_token_ms": a.ttft_per_token_ms,
        "itl_ms": a.itl_ms,
        "max_concurrency": 1024,
    }
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pd_routers.") as tmpdir, proc_group(Path(tmpdir)) as group:
        tmp = Path(tmpdir)
        engine_procs: list[Proc] = []
        prefills, decodes = start_engines(group, pin, sim_opts, engine_procs)
        systems = [
            System("direct-pd", None, lambda body: direct_pd_sender(prefills, decodes, body)),
            start_narwhal(group, pin, tmp, prefills, decodes),
            start_vllm_router(group, pin, tmp, prefills, decodes),
        ]
        if a.baseline_serve:
            systems.append(start_narwhal(group, pin, tmp, prefills, decodes, BASELINE, a.baseline_serve))
        systems = [s for s in systems if s.name in a.systems]
        pin.pin_self()
        for rep in range(a.reps):
            for prompt in a.prompts:
                text, max_tokens = workload(prompt, a.max_tokens)
                body = completion_body(text, max_tokens)
                for conc in a.concurrency:
                    order = systems[rep % len(systems) :] + systems[: rep % len(systems)]
                    for system in order:
                        cpu0 = [0.0, 0.0, 0.0]
                        pid = system.proc.pid if system.proc else 0

                        def mark(pid: int = pid, cpu0: list[float] = cpu0) -> None:
                            cpu0[0] = proc_cpu_s(pid) if pid else 0.0
                            cpu0[1] = sum(proc_cpu_s(p.pid) for p in engine_procs)
                            cpu0[2] = proc_sys_cpu_s(pid) if pid else 0.0

                        res = run_async(
                            closed_loop(
                                system.make_sender(body), conc, a.duration, warmup_s=a.warmup, on_measure=mark
                            )
                        )
                        cpu = (proc_cpu_s(pid) - cpu0[0]) if pid else 0.0
                        sys_cpu = (proc_sys_cpu_s(pid) - cpu0[2]) if pid else 0.0
                        engines_cpu = sum(proc_cpu_s(p.pid) for p in engine_procs) - cpu0[1]
                        s = res.summary()
                        n_all = len(res.samples)
                        # CPU over the measured window ÷ every request sent in it (completed + failed)
                        s["cpu_ms_per_req"] = cpu / n_all * 1e3 if system.proc and n_all else 0.0
                        # ... and ÷ every token frame the clients received (the relay's unit of work)
                        s["cpu_us_per_token"] = (
                            cpu / s["frames"] * 1e6 if system.proc and s["frames"] else 0.0
                        )
                        s["engine_cpu_ms_per_req"] = engines_cpu / n_all * 1e3 if n_all else 0.0
                        s["router_cpu_util"] = cpu / res.wall_s if system.proc else 0.0
                        s["router_sys_share"] = sys_cpu / cpu if cpu else 0.0  # kernel's part
                        row = {"system": system.name, "prompt": prompt, "concurrency": conc, "rep": rep, **s}
                        row["error_kinds"] = dict(res.errors)
                        rows.append(row)
                        print(
                            f"rep {rep} {prompt:5} c={conc:<3} {system.name:12} "
                            f"{s['rps']:8.1f} req/s p50 {s['p50_ms']:7.1f} p99 {s['p99_ms']:7.1f} "
                            f"ttft50 {s['ttft_p50_ms']:6.1f} ttft99 {s['ttft_p99_ms']:6.1f} "
                            f"cpu/req {s['cpu_ms_per_req']:.3f} ms cpu/tok {s['cpu_us_per_token']:.1f} us "
                            f"(sys {s['router_sys_share']:.0%}) "
                            f"engines {s['engine_cpu_ms_per_req']:.3f} ms/req err {int(s['errors'])} "
                            f"lg-cpu {s['loadgen_cpu_util']:.2f}",
                            file=sys.stderr,
                            flush=True,
                        )
    return {"pinning": pin.describe(), "sim": sim_opts, "rows": rows}


METRICS = (
    "rps",
    "p50_ms",
    "p99_ms",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "cpu_ms_per_req",
    "cpu_us_per_token",
    "engine_cpu_ms_per_req",
    "loadgen_cpu_util",
)


def aggregate(rows: list[dict[str, Any]]) -> dict[tuple[str, int, str], dict[str, Spread]]:
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["prompt"], r["concurrency"], r["system"]), []).append(r)
    return {k: {m: Spread.of([r[m] for r in v]) for m in METRICS} for k, v in groups.items()}


def report(result: dict[str, Any], command: str) -> str:
    agg = aggregate(result["rows"])
    reps = max((r["rep"] for r in result["rows"]), default=0) + 1
    out = [
        f"Command: `{command}`",
        "",
        f"Pinning: {result['pinning']}. Engines: {json.dumps(result['sim'])}. "
        f"Median of {reps} runs (min–max in parentheses).",
        "",
    ]
    headers = [
        "workload",
        "streams",
        "system",
        "req/s",
        "p50 ms",
        "p99 ms",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "router CPU ms/req",
        "router CPU µs/token",
        "engines CPU ms/req",
        "req/s ÷ best router",
        "p50 ÷ best router",
        "req/s ÷ floor",
        "errors",
    ]
    table: list[list[str]] = []
    keys = sorted({(k[0], k[1]) for k in agg}, key=lambda k: (k[0] != "short", k[0], k[1]))
    errors: dict[tuple[str, int, str], int] = {}
    for r in result["rows"]:
        key = (r["prompt"], r["concurrency"], r["system"])
        errors[key] = errors.get(key, 0) + int(r["errors"])
    for prompt, conc in keys:
        systems = {k[2]: v for k, v in agg.items() if k[0] == prompt and k[1] == conc}
        routers = {n: v for n, v in systems.items() if n not in ("direct-pd", BASELINE)}
        best_rps = max((v["rps"].median for v in routers.values()), default=0.0)
        best_p50 = min((v["p50_ms"].median for v in routers.values()), default=0.0)
        floor = systems.get("direct-pd")
        for name in ("direct-pd", "narwhal", BASELINE, "vllm-router"):
            if name not in systems:
                continue
            v = systems[name]
            is_router = name != "direct-pd"
            table.append(
                [
                    prompt,
                    str(conc),
                    name,
                    v["rps"].fmt(0),
                    v["p50_ms"].fmt(1),
                    v["p99_ms"].fmt(1),
                    v["ttft_p50_ms"].fmt(1),
                    v["ttft_p99_ms"].fmt(1),
                    v["cpu_ms_per_req"].fmt(3) if is_router else "—",
                    v["cpu_us_per_token"].fmt(1) if is_router else "—",
                    v["engine_cpu_ms_per_req"].fmt(3),
                    f"{v['rps'].median / best_rps:.2f}" if is_router and best_rps else "—",
                    f"{v['p50_ms'].median / best_p50:.2f}" if is_router and best_p50 else "—",
                    f"{v['rps'].median / floor['rps'].median:.2f}" if floor and floor["rps"].median else "—",
                    str(errors[(prompt, conc, name)]),
                ]
            )
    out.append(markdown_table(headers, table))
    lg = [r["loadgen_cpu_util"] for r in result["rows"]]
    out += [
        "",
        f"Load generator CPU utilisation per run: max {max(lg, default=0):.2f} (1.00 = its core saturated).",
    ]
    return "\n".join(out) + "\n"


def collapse_top(raw: str, n: int = 25) -> tuple[str, str]:
    """Top ``n`` functions by self and by inclusive samples from py-spy's collapsed (raw) output."""
    selfc: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        total += c
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].split("/")[-1] + ")" if " (" in f else f
            for f in stack.split(";")
        ]
        selfc[frames[-1]] = selfc.get(frames[-1], 0) + c
        for f in set(frames):
            incl[f] = incl.get(f, 0) + c

    def table(d: dict[str, int]) -> str:
        rows = sorted(d.items(), key=lambda kv: -kv[1])[:n]
        return markdown_table(
            ["function (file)", "% of samples"], [[f"`{k}`", f"{100 * v / total:.1f}"] for k, v in rows]
        )

    return table(selfc), table(incl)


def profile(a: argparse.Namespace) -> int:
    """py-spy on narwhal-serve while ``--concurrency[0]`` streams of ``--prompts[0]`` run for ``--duration``.

    The router gets a CPU of its own (engines and load generator share the other): py-spy samples
    wall-clock stacks, so a router preempted inside a send by the engine it just woke (same CPU)
    would show that wait as the send's cost. Alone on its CPU, its samples are its CPU time.
    """
    import subprocess

    pin = Pinning.default()
    engine_pin = Pinning(pin.loadgen, pin.loadgen)
    sim_opts = {
        "ttft_base_ms": a.ttft_base_ms,
        "ttft_per_token_ms": a.ttft_per_token_ms,
        "itl_ms": a.itl_ms,
        "max_concurrency": 1024,
    }
    conc = a.concurrency[0]
    text, max_tokens = workload(a.prompts[0], a.max_tokens)
    with tempfile.TemporaryDirectory(prefix="pd_profile.") as tmpdir, proc_group(Path(tmpdir)) as group:
        tmp = Path(tmpdir)
        prefills, decodes = start_engines(group, engine_pin, sim_opts)
        system = start_narwhal(group, pin, tmp, prefills, decodes)
        assert system.proc is not None
        raw = tmp / "narwhal.collapsed"
        spy = subprocess.Popen(
            [
                str(BIN / "py-spy"),
                "record",
                "-p",
                str(system.proc.pid),
                "-d",
                str(int(a.duration) + 1),
                "-r",
                "200",
                "--gil",
                "-f",
                "raw",
                "-o",
                str(raw),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        try:
            pin.pin_self()
            res = run_async(
                closed_loop(
                    system.make_sender(completion_body(text, max_tokens)),
                    conc,
                    a.duration,
                    warmup_s=0.2,
                )
            )
            spy.wait(timeout=60)
        finally:
            if spy.poll() is None:
                spy.kill()
                spy.wait()
        text = raw.read_text() if raw.exists() else ""
        s = res.summary()
        self_t, incl_t = collapse_top(text)
        out = (
            f"Command: `{shlex.join(['python', *sys.argv])}`\n\n"
            f"narwhal-serve under {conc} streams ({a.prompts[0]}) for {a.duration:.0f} s: {s['rps']:.0f} req/s, p50 {s['p50_ms']:.1f} ms, "
            f"p99 {s['p99_ms']:.1f} ms (py-spy at 200 Hz slows it a little). "
            f"Router alone on CPU {_cpus(pin.servers)}; engines and load generator on CPU {_cpus(pin.loadgen)}.\n\n"
            f"### Self time\n\n{self_t}\n\n### Inclusive time\n\n{incl_t}\n"
        )
        sys.stdout.write(out)
        if a.out:
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(out)
            Path(a.out).with_suffix(".collapsed").write_text(text)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke: 1 rep, 16 streams, short prompt, 1 s runs")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64, 256])
    ap.add_argument(
        "--prompts",
        type=lambda s: s.split(","),
        default=["short", "2k", "8k", "long", "short-256"],
        help="workloads: short / 2k / 8k (2,000 / 8,000 characters) / long (16,561) prompt with --max-tokens output, or <prompt>-<N> for N tokens",
    )
    ap.add_argument(
        "--systems",
        type=lambda s: s.split(","),
        default=["direct-pd", "narwhal", BASELINE, "vllm-router"],
    )
    ap.add_argument(
        "--baseline-serve",
        default="",
        help=f"another checkout's narwhal-serve, run side by side as {BASELINE!r} (a before/after)",
    )
    ap.add_argument("--duration", type=float, default=4.0, help="measured seconds per run")
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--ttft-base-ms", type=float, default=5.0)
    ap.add_argument("--ttft-per-token-ms", type=float, default=0.05)
    ap.add_argument("--itl-ms", type=float, default=2.0)
    ap.add_argument("--out", default="", help="also write the markdown table (and a .json) here")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="py-spy narwhal-serve at --concurrency and --prompts (first values)",
    )
    a = ap.parse_args()
    if a.profile:
        return profile(a)
    if a.quick:
        a.reps, a.concurrency, a.prompts, a.duration, a.warmup = 1, [16], ["short"], 1.0, 0.3
    command = shlex.join(["python", *sys.argv])
    t0 = time.monotonic()
    result = run_matrix(a)
    text = report(result, command)
    text += f"\nTotal bench time {time.monotonic() - t0:.0f} s.\n"
    sys.stdout.write(text)
    if a.out:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
