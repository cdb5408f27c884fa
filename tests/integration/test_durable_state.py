"""Acknowledged = durable, on real full and read-only filesystems (a 64 KiB tmpfs) and real SIGKILL.

A drain answered 200 is on disk where the successor reads it; a drain whose state cannot be written
answers 503 naming the error; serving goes on meanwhile, and ``/ready`` and ``/metrics`` say why the
control plane is degraded. The tmpfs is unmounted by its fixture even when a test fails.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import durability
from tests.support.fleet import start_sims
from tests.support.ha import (
    LEASE_TTL_S,
    STANDBY,
    controls,
    drain,
    epoch_of,
    ha_router,
    held,
    ready,
    start_pair,
    wait_controls,
)
from tests.support.procs import proc_group
from tests.support.smallfs import SmallFs, small_tmpfs
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[SmallFs]:
    with small_tmpfs(tmp_path / "statefs") as mounted:
        yield mounted


@pytest.mark.parametrize("fault", durability.FAULTS)
def test_single_router_never_acknowledges_an_unwritten_drain(tmp_path: Path, fs: SmallFs, fault: str) -> None:
    errno_text = "No space left on device" if fault == "full" else "Read-only file system"
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3, itl_ms=2)
        result = durability.single_router(group, tmp_path, sims, fs, fault)
    seen = result.during_fault
    assert seen["drain_status"] == 503, seen
    # refused before it starts (a periodic write already failed) or undone after its write failed
    assert seen["drain_error"].startswith("state not persisted: ") and errno_text in seen["drain_error"]
    assert seen["drain_error"].endswith(
        ("; change undone, repeat the request", "; lifecycle changes refused until a state write succeeds")
    )
    # the control plane is degraded and says why; serving is not
    assert seen["ready_status"] == 200 and errno_text in seen["control_degraded"]
    assert seen["completion_status"] == 200
    assert seen["persist_failures"] >= 1
    assert result.refused == ["e0"] and result.acked == ["e0"]
    assert result.lost == []  # after kill -9 and --resume every acknowledged drain is held


@pytest.mark.parametrize("fault", durability.FAULTS)
def test_ha_pair_loses_no_acknowledged_drain_when_the_state_dir_fails(
    tmp_path: Path, fs: SmallFs, fault: str
) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3, itl_ms=2)
        result = durability.ha_pair(group, tmp_path, sims, fs, fault)
    seen = result.during_fault
    # the shared handoff beside the lease is written first: the drains are durable and acknowledged
    assert result.acked == ["e0"] and result.refused == [], seen
    assert "not written" in seen["control_degraded"] and seen["persist_failures"] >= 1
    assert seen["completion_status"] == 200
    assert result.successor_epoch == 2
    assert result.lost == []


def test_router_that_lost_its_lease_to_a_local_error_claims_again_when_it_clears(
    tmp_path: Path, fs: SmallFs
) -> None:
    """The lease directory turns read-only for longer than the lease: renewals fail (EROFS), the
    router stops controlling; once it is writable again the router claims again — no restart."""
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 2, roles=["prefill", "decode"], itl_ms=2)
        router = ha_router(group, tmp_path, sims, "a", lease_path=fs.path / "router.lease", wait_ready=True)
        assert router.get("/ready").json()["epoch"] == 1
        fs.read_only()
        try:
            wait_for(
                "control lost to the local error",
                lambda: router.get("/ready").json()["reason"].startswith("lease renewal failing: "),
                timeout=30,
            )
            assert "Read-only file system" in router.get("/ready").json()["reason"]
            assert "lease renewal error (retrying within validity)" in router.proc.output()
            # the record on disk (readable, not renewable) must have expired before the fault
            # clears, or the router's re-claim of its own unexpired record keeps epoch 1
            expires = float(json.loads((fs.path / "router.lease").read_text())["expires_at"])
            wait_for("the lease record expired", lambda: time.time() > expires + 0.2, timeout=30)
        finally:
            fs.read_write()
        wait_for("claimed again", lambda: router.get("/ready").status_code == 200, timeout=30)
        ready = router.get("/ready").json()
        assert ready["epoch"] == 2 and ready["control_ready"] is True  # the record had expired
        assert "lease claimed again: epoch 2" in router.proc.output()
        body = {"model": "sim-model", "prompt": "after the error", "max_tokens": 4}
        assert router.post("/v1/completions", body).status_code == 200
        assert router.proc.alive()


def test_full_lease_directory_degrades_control_but_keeps_the_lease_and_serving(
    tmp_path: Path, fs: SmallFs
) -> None:
    """Lease and shared handoff on the full tmpfs: renewals still land (in place), so the fleet keeps
    its controller and serves; lifecycle changes are refused (nothing durable); after the disk
    clears they are acknowledged again."""
    lease_path = fs.path / "router.lease"
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3, itl_ms=2)
        a, b = start_pair(group, tmp_path, sims, lease_path=lease_path)
        fs.fill()
        try:
            filled = json.loads(lease_path.read_text())["updated_at"]
            wait_for(  # several TTLs of renewals on the full disk
                "renewals on a full disk",
                lambda: _updated_at(lease_path) > filled + 3 * LEASE_TTL_S,
                timeout=60,
            )
            r = a.post("/narwhal/lifecycle/drain", {"engines": ["e0"], "deadline_s": 60})
            assert r.status_code == 503 and "No space left on device" in r.json()["error"]
            ready = a.get("/ready")
            assert ready.status_code == 200 and ready.json()["epoch"] == 1
            assert "No space left on device" in ready.json()["control_degraded"]
            body = {"model": "sim-model", "prompt": "full disk", "max_tokens": 4}
            assert a.post("/v1/completions", body).status_code == 200
            assert b.get("/ready").json()["epoch"] == 0 and "TAKEOVER" not in b.proc.output()
        finally:
            fs.free()
        wait_for(
            "state persisted again", lambda: a.get("/ready").json()["control_degraded"] == "", timeout=30
        )
        r = a.post("/narwhal/lifecycle/drain", {"engines": ["e0"], "deadline_s": 60})
        assert r.status_code == 200, r.text
        assert a.get("/ready").json()["epoch"] == 1


def _updated_at(lease_path: Path) -> float:
    """The record's ``updated_at``; 0 while a reader catches an in-place rewrite mid-way."""
    try:
        return float(json.loads(lease_path.read_text())["updated_at"])
    except (ValueError, KeyError, OSError):
        return 0.0


def test_read_only_lease_directory_past_the_max_handoff_age_then_holder_killed_standby_takes_over(
    tmp_path: Path, fs: SmallFs
) -> None:
    """The lease directory read-only for longer than ``standby_max_handoff_age_s`` (no claim, no
    renewal, no shared write: nothing is acknowledged meanwhile), the holder killed, the directory
    writable again: the standby takes over from the durable shared handoff, however old, with every
    acknowledged change."""
    lease_path = fs.path / "router.lease"
    shared = fs.path / "router.lease.handoff.json"
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3, itl_ms=2)
        a, b = start_pair(group, tmp_path, sims, lease_path=lease_path)
        assert drain(a, "e0").status_code == 200
        fs.read_only()
        try:
            a.proc.kill9()
            wait_for(
                "the standby cannot claim",
                lambda: "Read-only file system" in str(ready(b)[1].get("reason", "")),
                timeout=60,
            )
            # past the max age since the standby's last good poll (mirrored into its state file)
            # and since the last shared write
            polled = json.loads((tmp_path / "b.state.json").read_text())["at"]
            last = max(polled, json.loads(shared.read_text())["at"])
            max_age = float(STANDBY[STANDBY.index("--standby-max-handoff-age") + 1])
            wait_for(
                "every handoff is older than the max age",
                lambda: time.time() - last > max_age + 1,
                timeout=60,
            )
            assert not controls(b)
        finally:
            fs.read_write()
        wait_controls(b, timeout=60)
        assert epoch_of(b) == 2 and held(b, "e0")
