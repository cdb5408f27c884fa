"""Idle CPU of each router over the same 4 simulated engines (no client load).

Starts the engines, ``narwhal-serve`` (defaults: journal, monitoring, lifecycle contract), optionally
another checkout's ``narwhal-serve`` (``--baseline-serve``) and ``vllm-router``; waits ``--settle``
seconds, then reads each router's utime + stime over ``--duration`` seconds. ``--profile`` records
py-spy (``--gil``) on ``narwhal-serve`` during the window and prints the top functions.

    .venv/bin/python bench/idle_cpu.py --duration 20
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import Pinning, proc_cpu_s
from bench.pd_routers import BASELINE, collapse_top, start_engines, start_narwhal, start_vllm_router
from narwhal_testing.procs import BIN, proc_group


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument(
        "--baseline-serve", default="", help="another checkout's narwhal-serve, run as narwhal-base"
    )
    ap.add_argument("--fleet-extra", default="{}", help="JSON deep-merged into narwhal's fleet document")
    ap.add_argument("--raw-out", default="", help="keep py-spy's collapsed stacks here")
    ap.add_argument("--profile", action="store_true", help="py-spy narwhal-serve during the window")
    a = ap.parse_args()
    pin = Pinning.default()
    opts = {"ttft_base_ms": 5.0, "ttft_per_token_ms": 0.05, "itl_ms": 2.0, "max_concurrency": 1024}
    with tempfile.TemporaryDirectory(prefix="idle_cpu.") as tmpdir, proc_group(Path(tmpdir)) as group:
        tmp = Path(tmpdir)
        prefills, decodes = start_engines(group, pin, opts)
        extra = json.loads(a.fleet_extra)
        systems = [
            start_narwhal(group, pin, tmp, prefills, decodes, extra=extra),
            start_vllm_router(group, pin, tmp, prefills, decodes),
        ]
        if a.baseline_serve:
            systems.append(start_narwhal(group, pin, tmp, prefills, decodes, BASELINE, a.baseline_serve))
        time.sleep(a.settle)
        spy = None
        raw = tmp / "spy.txt"
        if a.profile and systems[0].proc is not None:
            cmd = [str(BIN / "py-spy"), "record", "--gil", "-r", "250", "-f", "raw", "-o", str(raw)]
            cmd += ["-d", str(int(a.duration)), "-p", str(systems[0].proc.pid)]
            spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        before = {s.name: proc_cpu_s(s.proc.pid) for s in systems if s.proc}
        time.sleep(a.duration)
        after = {s.name: proc_cpu_s(s.proc.pid) for s in systems if s.proc}
        for name, cpu in before.items():
            print(f"{name:12s} idle CPU {1000 * (after[name] - cpu) / a.duration:6.2f} ms/s")
        if spy is not None:
            spy.wait(timeout=a.duration + 30)
            if a.raw_out:
                Path(a.raw_out).write_text(raw.read_text())
            self_top, incl_top = collapse_top(raw.read_text(), 25)
            print(self_top)
            print(incl_top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
