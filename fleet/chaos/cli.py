"""The chaos drill's command line: options → ``DrillOptions``, the stack in a temporary (or kept)
directory, the summary on stdout, the JSON report, exit status 1 when an invariant is violated.

SIGTERM ends the drill like an exception: every child is stopped by PID on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import fleet.chaos
from fleet.chaos.drill import FAULT_KINDS, Drill, DrillOptions
from fleet.chaos.report import passed, summary_text
from fleet.chaos.stack import ChaosStack

SIM_OPTIONS = {"ttft_base_ms": 2.0, "itl_ms": 2.0, "max_concurrency": 256}


def terminate(signum: int, _frame: object) -> None:
    """SIGTERM handler: unwind (``finally`` blocks stop every child by PID)."""
    raise SystemExit(128 + signum)


def run_drill(options: DrillOptions, workdir: Path) -> dict[str, Any]:
    """Bring the stack up in ``workdir``, run the drill, stop every child; the JSON report."""
    stack = ChaosStack(workdir, options.engines, SIM_OPTIONS)

    async def go() -> dict[str, Any]:
        try:
            await stack.bring_up()
            print(f"stack up in {workdir}", flush=True)
            return await Drill(stack, options).run()
        finally:
            await stack.close()

    try:
        return asyncio.run(go())
    finally:
        stack.close_now()  # interrupted (SIGTERM): every child by PID; no-op after close()


def parse_args(argv: Sequence[str] | None) -> tuple[DrillOptions, argparse.Namespace]:
    ap = argparse.ArgumentParser(
        prog="chaos", description=fleet.chaos.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    d = DrillOptions()
    ap.add_argument(
        "--duration", type=float, default=None, help=f"seconds of faults + restarts ({d.duration:g})"
    )
    ap.add_argument(
        "--tail", type=float, default=None, help=f"max extra seconds for the last restart ({d.tail:g})"
    )
    ap.add_argument("--engines", type=int, default=None, help=f"({d.engines})")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--faults", type=lambda s: tuple(x for x in s.split(",") if x), default=FAULT_KINDS)
    ap.add_argument("--concurrency", type=int, default=None, help=f"({d.concurrency})")
    ap.add_argument("--max-tokens", type=int, default=d.max_tokens)
    ap.add_argument("--think-s", type=float, default=d.think_s)
    ap.add_argument("--short", action="store_true", help="CI configuration (≤ ~90 s)")
    ap.add_argument("--json", default="", help="write the JSON report here")
    ap.add_argument("--keep", default="", help="keep the drill directory (logs, db) here")
    a = ap.parse_args(argv)
    unknown = set(a.faults) - set(FAULT_KINDS)
    if unknown:
        ap.error(f"unknown faults {sorted(unknown)} (choose from {','.join(FAULT_KINDS)})")
    given = {
        k: v
        for k, v in {
            "duration": a.duration, "tail": a.tail, "engines": a.engines, "concurrency": a.concurrency,
        }.items()
        if v is not None
    }  # fmt: skip
    common = {"seed": a.seed, "faults": a.faults, "max_tokens": a.max_tokens, "think_s": a.think_s}
    # --short is the CI configuration: it wins over the sizes given with it
    options = DrillOptions.short(**common) if a.short else DrillOptions(**given, **common)
    return options, a


def main(argv: Sequence[str] | None = None) -> int:
    options, a = parse_args(argv)
    signal.signal(signal.SIGTERM, terminate)  # stop every child by PID on the way out
    shown = list(argv) if argv is not None else sys.argv[1:]
    print("command:", shlex.join(["python", "bench/chaos.py", *shown]))
    if a.keep:
        Path(a.keep).mkdir(parents=True, exist_ok=True)
        ctx: contextlib.AbstractContextManager[str] = contextlib.nullcontext(a.keep)
    else:
        ctx = tempfile.TemporaryDirectory(prefix="chaos.")
    with ctx as tmpdir:
        report = run_drill(options, Path(tmpdir))
    print(summary_text(report))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(report, indent=2))
    return 0 if passed(report) else 1
