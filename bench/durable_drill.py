"""Drill: acknowledged drains on a full or read-only state directory, then SIGKILL of the router.

Each repetition mounts a fresh 64 KiB tmpfs (root needed), runs one drill per topology and fault
(``narwhal_testing/durability.py``) and counts drains answered 200 (acknowledged), answered 503
(refused: not written) and acknowledged-but-lost on the successor (``--resume`` for a single
router, the warm standby for an HA pair). The promise: lost is always 0.

    .venv/bin/python bench/durable_drill.py [--reps 5] [--out bench/results/durable_drill.md]
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._common import markdown_table  # noqa: E402
from narwhal_testing import durability  # noqa: E402
from narwhal_testing.fleet import start_sims  # noqa: E402
from narwhal_testing.procs import proc_group  # noqa: E402
from narwhal_testing.smallfs import small_tmpfs  # noqa: E402

DRILLS = {"single": durability.single_router, "ha": durability.ha_pair}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    totals: dict[tuple[str, str], dict[str, int]] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="narwhal-drill-") as tmp:
        for rep in range(args.reps):
            for topology, drill in DRILLS.items():
                for fault in durability.FAULTS:
                    work = Path(tmp) / f"{topology}-{fault}-{rep}"
                    work.mkdir()
                    with proc_group(work) as group, small_tmpfs(work / "statefs") as fs:
                        sims = start_sims(group, 3, itl_ms=2)
                        result = drill(group, work, sims, fs, fault)
                    row = totals.setdefault(
                        (topology, fault), {"runs": 0, "acked": 0, "refused": 0, "lost": 0}
                    )
                    row["runs"] += 1
                    row["acked"] += len(result.acked)
                    row["refused"] += len(result.refused)
                    row["lost"] += len(result.lost)
                    print(
                        f"rep {rep + 1}/{args.reps} {topology:6} {fault:9} acked={result.acked} "
                        f"refused={result.refused} lost={result.lost} successor epoch {result.successor_epoch}",
                        flush=True,
                    )
    rows = [
        [topology, fault, str(v["runs"]), str(v["acked"]), str(v["refused"]), str(v["lost"])]
        for (topology, fault), v in sorted(totals.items())
    ]
    table = markdown_table(["topology", "fault", "runs", "acknowledged", "refused (503)", "lost"], rows)
    lost = sum(v["lost"] for v in totals.values())
    command = "python bench/durable_drill.py " + shlex.join(sys.argv[1:])
    report = (
        "# Durable-state drill\n\n"
        f"Command: `{command.strip()}` ({time.monotonic() - started:.0f} s).\n\n"
        "Single router: the state file on a 64 KiB tmpfs, no lease; the drain during the fault must be\n"
        "refused, the repeat after it clears acknowledged; SIGKILL; `--resume`. HA pair: lease and shared\n"
        "handoff on a healthy disk, both routers' own state files on the tmpfs; the drain during the fault\n"
        "is acknowledged from the shared copy; SIGKILL of the primary; the standby takes over.\n\n"
        f"{table}\n\nAcknowledged drains lost: **{lost}**.\n"
    )
    print(report)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report, encoding="utf-8")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
