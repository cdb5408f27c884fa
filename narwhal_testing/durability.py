"""Drills for "an acknowledged drain is never lost" on a full or read-only state directory.

Each drill runs real routers over real simulated engines, puts the state directory (a small tmpfs,
``narwhal_testing.smallfs``) into a fault, drains engines, then kills the controlling router with
SIGKILL and checks on its successor (``--resume`` or the warm standby) that every drain that was
answered 200 is still held. Used by ``tests/integration/test_durable_state.py`` (assertions) and
``bench/durable_drill.py`` (repetitions, counts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from narwhal_testing.fleet import FAST, SimEngine, write_fleet
from narwhal_testing.ha import epoch_of, held, resumed, start_pair
from narwhal_testing.procs import ProcGroup
from narwhal_testing.router import RouterHandle, start_router
from narwhal_testing.smallfs import SmallFs
from narwhal_testing.waits import wait_for

__all__ = [
    "FAULTS",
    "DrillResult",
    "fault_off",
    "fault_on",
    "ha_pair",
    "single_router",
]
FAULTS = ("full", "read_only")


@dataclass
class DrillResult:
    topology: str
    fault: str
    acked: list[str] = field(default_factory=list)  # drains answered 200
    refused: list[str] = field(default_factory=list)  # drains answered 503 (not acknowledged)
    lost: list[str] = field(default_factory=list)  # acknowledged, but active on the successor
    during_fault: dict[str, Any] = field(default_factory=dict)  # what clients and operators saw
    successor_epoch: int = 0


def fault_on(fs: SmallFs, fault: str) -> None:
    if fault == "full":
        fs.fill()
    else:
        fs.read_only()


def fault_off(fs: SmallFs, fault: str) -> None:
    if fault == "full":
        fs.free()
    else:
        fs.read_write()


def drain(router: RouterHandle, iid: str, result: DrillResult) -> httpx.Response:
    r = router.post("/narwhal/lifecycle/drain", {"engines": [iid], "deadline_s": 120}, control=True)
    (result.acked if r.status_code == 200 else result.refused).append(iid)
    return r


def _complete(router: RouterHandle) -> int:
    body = {"model": "sim-model", "prompt": "during the fault", "max_tokens": 4}
    return router.post("/v1/completions", body, timeout=30).status_code


def _observe(router: RouterHandle, result: DrillResult, last: httpx.Response) -> None:
    ready = router.get("/ready", control=True)
    result.during_fault = {
        "drain_status": last.status_code,
        "drain_error": last.json().get("error", ""),
        "ready_status": ready.status_code,
        "control_degraded": ready.json().get("control_degraded", ""),
        "completion_status": _complete(router),
        "persist_failures": router.metrics().get("narwhal_persist_failures_total", 0.0),
    }


def single_router(
    group: ProcGroup, work: Path, sims: Sequence[SimEngine], fs: SmallFs, fault: str
) -> DrillResult:
    """No lease: the state file on ``fs`` is the only durable copy. The drain of e0 during the
    fault must be refused; repeated after the fault clears it is acknowledged; kill -9; the
    ``--resume``d router must hold it."""
    result = DrillResult("single", fault)
    fleet = write_fleet(
        work, sims, name="single.fleet.json", state_path=str(fs.path / "state.json"), extra=FAST
    )
    router = start_router(group, fleet, work, name="single", wait_ready=True)
    fault_on(fs, fault)
    try:
        _observe(router, result, drain(router, "e0", result))
    finally:
        fault_off(fs, fault)
    wait_for(
        "state persisted again", lambda: router.get("/ready").json()["control_degraded"] == "", timeout=30
    )
    drain(router, "e0", result)
    router.proc.kill9()
    again = start_router(group, fleet, work, ["--resume"], name="single-resumed")
    wait_for("resumed", lambda: resumed(again), timeout=30)
    result.lost = [iid for iid in result.acked if not held(again, iid)]
    result.successor_epoch = again.get("/ready").json()["epoch"]
    again.proc.stop()
    return result


def ha_pair(group: ProcGroup, work: Path, sims: Sequence[SimEngine], fs: SmallFs, fault: str) -> DrillResult:
    """Lease (and the shared handoff beside it) on a healthy disk, both routers' own state files on
    ``fs``. The drain during the fault is acknowledged from the shared copy; the primary is killed
    and the standby must hold it."""
    result = DrillResult("ha", fault)
    a, b = start_pair(group, work, sims, state_dir=fs.path)
    fault_on(fs, fault)
    try:
        _observe(a, result, drain(a, "e0", result))
        a.proc.kill9()
        wait_for("standby takes over", lambda: epoch_of(b) >= 2, timeout=30)
        result.lost = [iid for iid in result.acked if not held(b, iid)]
        result.successor_epoch = b.get("/ready").json()["epoch"]
    finally:
        fault_off(fs, fault)
    b.proc.stop()
    return result
