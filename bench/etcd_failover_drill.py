"""Drill: a lifecycle change acknowledged right before ``kill -9`` of the lease holder, on etcd.

A primary and a warm standby ``narwhal-serve`` on a three-member etcd cluster (child processes) and
three simulated engines. Each round the holder acknowledges a change of e0 (drain, or readmission
of a restarted e0, alternating), is SIGKILLed immediately after the 200, and the standby must take
over with that change; the killed router rejoins as the new holder's standby. Reports the rounds,
the acknowledgements lost (the claim: 0) and kill → successor ``/ready`` 200.

    .venv/bin/python bench/etcd_failover_drill.py [--rounds 10] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._common import Spread, markdown_table  # noqa: E402
from narwhal_testing.etcd import EtcdCluster  # noqa: E402
from narwhal_testing.etcd_ha import etcd_pair, etcd_standby  # noqa: E402
from narwhal_testing.fleet import restart_sim, start_sims  # noqa: E402
from narwhal_testing.ha import controls, drain, engine_state, epoch_of, held  # noqa: E402
from narwhal_testing.procs import proc_group  # noqa: E402
from narwhal_testing.waits import wait_for  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    command = ".venv/bin/python bench/etcd_failover_drill.py " + shlex.join(["--rounds", str(args.rounds)])
    lost: list[str] = []
    took: list[float] = []
    with tempfile.TemporaryDirectory(prefix="narwhal-etcd-drill-") as tmp:
        work = Path(tmp)
        cluster = EtcdCluster(work / "etcd")
        try:
            cluster.start_all()
            prefix = "/narwhal-drill/"
            with proc_group(work) as group:
                sims = start_sims(group, 3, itl_ms=2)
                eps = cluster.endpoints
                holder, standby = etcd_pair(group, work, sims, eps, prefix)
                names = ("a", "b")
                for n in range(args.rounds):
                    action = "drain" if n % 2 == 0 else "readmit"
                    if action == "drain":
                        r = drain(holder, "e0")
                    else:
                        restart_sim(group, sims[0])
                        r = holder.post("/narwhal/lifecycle/readmit", {"engines": ["e0"]}, timeout=60)
                    if r.status_code != 200:
                        raise SystemExit(f"round {n}: {action} answered {r.status_code}: {r.text[:300]}")
                    before = epoch_of(holder)
                    holder.proc.kill9()
                    killed = time.monotonic()
                    try:
                        wait_for("takeover", lambda s=standby: controls(s), timeout=60, interval=0.01)
                    except AssertionError:
                        raise SystemExit(f"round {n}: no takeover within 60 s") from None
                    took.append(time.monotonic() - killed)
                    kept = (
                        held(standby, "e0")
                        if action == "drain"
                        else engine_state(standby, "e0")["accepts_new"]
                    )
                    if not kept or epoch_of(standby) != before + 1:
                        lost.append(f"round {n}: {action} lost ({engine_state(standby, 'e0')})")
                    print(f"round {n}: {action} kept={kept} takeover {took[-1]:.2f}s", file=sys.stderr)
                    back = etcd_standby(group, work, sims, names[0], eps, prefix, standby)
                    holder, standby, names = standby, back, (names[1], names[0])
        finally:
            cluster.close()
    headers = ["rounds", "acknowledged changes lost", "kill → successor /ready 200 s, median (min–max)"]
    rows = [[str(args.rounds), str(len(lost)), Spread.of(took).fmt(2)]]
    print(f"command: {command}")
    print(markdown_table(headers, rows))
    for line in lost:
        print(line)
    if args.out is not None:
        args.out.write_text(
            json.dumps({"command": command, "lost": lost, "takeover_s": took}, indent=2) + "\n"
        )
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
