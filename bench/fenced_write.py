"""What the durable write adds to a lifecycle POST: latency of the shared-handoff write, per backend.

A lifecycle POST answers only after the holder's handoff is stored where a successor finds it
(``HandoffStore.write``): the file backend writes ``<lease_path>.handoff.json`` (temp file, fsync,
rename, fsync dir) in a worker thread; the etcd backend commits a txn on ``<prefix>handoff``
guarded by the holder key's create revision, on a three-member cluster of child processes on
loopback. Both write the same document (the peer's example handoff after a resume) ``--writes``
times, sequentially, as the lifecycle does; this reports p50 / p99 / max.

    .venv/bin/python bench/fenced_write.py [--writes 500] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench._common import markdown_table  # noqa: E402
from narwhal_testing.etcd import EtcdCluster  # noqa: E402
from router.ha.etcd_client import EtcdClient  # noqa: E402
from router.ha.etcd_lease import EtcdLease, EtcdLeaseSettings  # noqa: E402
from router.ha.handoff import Handoff, validate  # noqa: E402
from router.ha.lease_backend import EtcdHandoffStore  # noqa: E402
from router.ha.persist import FileHandoffStore, HandoffStore  # noqa: E402

FIXTURE = REPO / "tests" / "fixtures"


def handoff_doc(holder: str, epoch: int) -> Handoff:
    """The peer's example handoff after a resume (engines, roles, counters, a drain record)."""
    doc = json.loads((FIXTURE / "peer_examples" / "handoff_after_resume.json").read_text())
    doc.update(holder=holder, epoch=epoch, at=time.time())
    return validate(doc)


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


async def measure(store: HandoffStore, doc: Handoff, writes: int) -> list[float]:
    out: list[float] = []
    for i in range(writes):
        d = doc.model_copy(update={"at": doc.at + i * 1e-3})
        t0 = time.perf_counter()
        await store.write(d)
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


async def run(writes: int, work: Path, model: str) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {}
    file_store = FileHandoffStore(work / "router.lease.handoff.json")
    results["file"] = await measure(file_store, handoff_doc("bench:file", 1), writes)
    cluster = EtcdCluster(work / "etcd")
    try:
        cluster.start_all()
        client = EtcdClient(cluster.endpoints, timeout_s=1.0)
        settings = EtcdLeaseSettings(  # a long lease: the bench measures writes, not renewals
            router_id="bench", prefix="/narwhal-bench/write/", model=model, ttl_s=120, safety_margin_s=10
        )
        lease = EtcdLease(settings, client)
        try:
            assert await lease.claim(), "could not claim the bench lease"
            store = EtcdHandoffStore(lease)
            results["etcd"] = await measure(store, handoff_doc(lease.holder, lease.epoch), writes)
            await lease.release()
        finally:
            await client.aclose()
    finally:
        cluster.close()
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--writes", type=int, default=500)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    command = ".venv/bin/python bench/fenced_write.py " + shlex.join(["--writes", str(args.writes)])
    with tempfile.TemporaryDirectory(prefix="narwhal-fenced-write-") as tmp:
        model = handoff_doc("x", 1).model
        results = asyncio.run(run(args.writes, Path(tmp), model))
    headers = ["backend", "writes", "p50 ms", "p99 ms", "max ms"]
    rows = [
        [name, str(len(xs)), f"{percentile(xs, 0.5):.2f}", f"{percentile(xs, 0.99):.2f}", f"{max(xs):.2f}"]
        for name, xs in results.items()
    ]
    print(f"command: {command}")
    print(markdown_table(headers, rows))
    if args.out is not None:
        args.out.write_text(json.dumps({"command": command, "ms": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
