"""Warm-standby takeover time: primary SIGKILLed → standby ``/ready`` 200.

For each lease TTL (default 1, 2, 5 s) and repetition: a primary and a standby ``narwhal-serve`` on
one lease (``--backend file``: one lease file; ``--backend etcd``: a three-member etcd cluster of
child processes, a fresh key prefix per run; etcd's smallest lease TTL is 2 s) over the same
simulated engines (contracted fleet, so the takeover includes the
identity check); the primary is killed at a random phase of its renewal period; the standby's
``/ready`` is polled every 5 ms. Renew interval and safety margin scale with the TTL (ttl/4 each);
the standby probes every ``--probe`` s and takes over after 2 missed probes.

Expected: the lease outlives the kill by TTL minus the time since the last renewal (uniform in
[0, renew)), then the standby needs up to one probe interval to notice, plus claim + apply +
identity check. The reference is TTL + 2 × probe interval.

    .venv/bin/python bench/takeover.py [--backend file|etcd] [--ttls 1 2 5] [--reps 5] [--probe 0.25] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._common import Spread, markdown_table  # noqa: E402
from narwhal_testing.etcd import EtcdCluster  # noqa: E402
from narwhal_testing.fleet import start_sims, write_fleet  # noqa: E402
from narwhal_testing.procs import ProcGroup, proc_group  # noqa: E402
from narwhal_testing.router import start_router  # noqa: E402

FAST = {"controller": {"monitor_interval_s": 0.2}}


def one_takeover(
    group: ProcGroup, work: Path, sims: Any, ttl: float, probe: float, rep: int, etcd: str = ""
) -> dict[str, float]:
    run = work / f"ttl{ttl:g}-rep{rep}"
    run.mkdir()
    renew = margin = ttl / 4
    where = (
        ["--etcd-endpoints", etcd, "--etcd-prefix", f"/narwhal-bench/ttl{ttl:g}-rep{rep}/"]
        if etcd
        else ["--lease-path", str(run / "router.lease")]
    )
    lease = [
        *where, "--lease-ttl", str(ttl),
        "--lease-renew-interval", str(renew), "--lease-safety-margin", str(margin),
    ]  # fmt: skip
    fa = write_fleet(run, sims, name="a.json", state_path=str(run / "a.state.json"), extra=FAST)
    fb = write_fleet(run, sims, name="b.json", state_path=str(run / "b.state.json"), extra=FAST)
    a = start_router(group, fa, run, [*lease, "--router-id", "a"], name=f"a{rep}", wait_ready=True)
    standby = ["--standby-of", a.url, "--standby-probe-interval", str(probe), "--standby-takeover-after", "2"]
    b = start_router(group, fb, run, [*lease, "--router-id", "b", *standby], name=f"b{rep}")
    deadline = time.monotonic() + 20
    while not (run / "b.state.json").exists():  # the standby holds a lease-validated snapshot
        if time.monotonic() > deadline:
            raise TimeoutError("standby never mirrored the primary")
        time.sleep(0.02)
    time.sleep(random.uniform(0, renew))  # random phase of the renewal period
    a.proc.kill9()
    killed = time.monotonic()
    with httpx.Client(timeout=1.0) as client:
        while True:
            try:
                if client.get(b.url + "/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - killed > ttl + 30:
                raise TimeoutError(f"standby not ready {ttl + 30}s after the kill")
            time.sleep(0.005)
    took = time.monotonic() - killed
    metrics = client_metric(b.url, "narwhal_takeover_seconds")
    b.proc.stop()
    return {"ttl": ttl, "seconds": took, "gap_metric": metrics}


def client_metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["file", "etcd"], default="file", help="lease backend")
    p.add_argument("--ttls", type=float, nargs="+", default=None, help="default 1 2 5 (etcd: 2 5)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--probe", type=float, default=0.25, help="standby probe interval (s)")
    p.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.ttls is None:
        args.ttls = [2.0, 5.0] if args.backend == "etcd" else [1.0, 2.0, 5.0]
    command = ".venv/bin/python bench/takeover.py " + shlex.join(
        [
            "--backend",
            args.backend,
            "--ttls",
            *[f"{t:g}" for t in args.ttls],
            "--reps",
            str(args.reps),
            "--probe",
            f"{args.probe:g}",
        ]
    )
    samples: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="narwhal-takeover-") as tmp:
        work = Path(tmp)
        cluster = EtcdCluster(work / "etcd") if args.backend == "etcd" else None
        with proc_group(work) as group:
            try:
                if cluster is not None:
                    cluster.start_all()
                eps = cluster.endpoints if cluster is not None else ""
                sims = start_sims(group, 3, itl_ms=2)
                for rep in range(args.reps):  # interleave TTLs so drift affects each alike
                    for ttl in args.ttls:
                        s = one_takeover(group, work, sims, ttl, args.probe, rep, eps)
                        samples.append(s)
                        print(f"ttl {ttl:g}s rep {rep}: {s['seconds']:.3f}s", file=sys.stderr)
            finally:
                if cluster is not None:
                    cluster.close()
    rows = []
    for ttl in args.ttls:
        took = [s["seconds"] for s in samples if s["ttl"] == ttl]
        gap = [s["gap_metric"] for s in samples if s["ttl"] == ttl]
        bound = ttl + 2 * args.probe
        rows.append(
            [
                f"{ttl:g}",
                str(len(took)),
                Spread.of(took).fmt(3),
                Spread.of(gap).fmt(3),
                f"{bound:.2f}",
                f"{sum(t <= bound for t in took)}/{len(took)}",
            ]
        )
    headers = [
        "TTL s",
        "n",
        "kill→/ready 200 s, median (min–max)",
        "narwhal_takeover_seconds",
        "TTL+2×probe",
        "≤ ref",
    ]
    print(f"command: {command}")
    print(markdown_table(headers, rows))
    if args.out is not None:
        args.out.write_text(json.dumps({"command": command, "samples": samples}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
