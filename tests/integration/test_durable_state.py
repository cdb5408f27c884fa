"""Acknowledged = durable, on real full and read-only filesystems (a 64 KiB tmpfs) and real SIGKILL.

A drain answered 200 is on disk where the successor reads it; a drain whose state cannot be written
answers 503 naming the error; serving goes on meanwhile, and ``/ready`` and ``/metrics`` say why the
control plane is degraded. The tmpfs is unmounted by its fixture even when a test fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import durability
from tests.support.fleet import start_sims, write_fleet
from tests.support.procs import proc_group
from tests.support.router import start_router
from tests.support.smallfs import SmallFs, small_tmpfs

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
    lease = ["--lease-path", str(fs.path / "router.lease"), "--router-id", "a", *durability.LEASE]
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 2, roles=["prefill", "decode"], itl_ms=2)
        fleet = write_fleet(tmp_path, sims, state_path=str(tmp_path / "a.state.json"), extra=durability.FAST)
        router = start_router(group, fleet, tmp_path, lease, name="a", wait_ready=True)
        assert router.get("/ready").json()["epoch"] == 1
        fs.read_only()
        try:
            durability.wait_for(
                "control lost to the local error",
                lambda: router.get("/ready").json()["reason"].startswith("lease renewal failing: "),
            )
            assert "Read-only file system" in router.get("/ready").json()["reason"]
            assert "lease renewal error (retrying within validity)" in router.proc.output()
        finally:
            fs.read_write()
        durability.wait_for("claimed again", lambda: router.get("/ready").status_code == 200)
        ready = router.get("/ready").json()
        assert ready["epoch"] == 2 and ready["control_ready"] is True  # the record had expired
        assert "lease claimed again: epoch 2" in router.proc.output()
        body = {"model": "sim-model", "prompt": "after the error", "max_tokens": 4}
        assert router.post("/v1/completions", body).status_code == 200
        assert router.proc.alive()
