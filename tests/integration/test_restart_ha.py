"""A restart keeps going when the active router dies: the activities follow the lease holder."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Temporal
from tests.integration.lifecycle_support import FAST
from tests.integration.restart_support import (
    engine_state,
    lifecycle,
    new_fleet,
    plan,
    start,
    supervisor_restarts,
    until,
)
from tests.support.fleet import SimEngine, process_start, start_supervisor, write_fleet
from tests.support.procs import ProcGroup, proc_group
from tests.support.router import RouterHandle, start_router

pytestmark = pytest.mark.integration

LEASE = ["--lease-ttl", "2.0", "--lease-renew-interval", "0.3", "--lease-safety-margin", "0.4"]
STANDBY = [
    "--standby-probe-interval",
    "0.05",
    "--standby-takeover-after",
    "2",
    "--standby-max-handoff-age",
    "5",
]


def _router(
    group: ProcGroup, tmp_path: Path, sims: list[SimEngine], name: str, *args: str, **kw: Any
) -> RouterHandle:
    fleet = write_fleet(
        tmp_path, sims, name=f"{name}.fleet.json", state_path=str(tmp_path / f"{name}.state.json"), extra=FAST
    )
    lease = ["--lease-path", str(tmp_path / "router.lease"), "--router-id", f"router-{name}", *LEASE]
    return start_router(group, fleet, tmp_path, [*lease, *args], name=name, **kw)


async def test_active_router_killed_mid_restart_continues_on_the_new_holder(
    temporal: Temporal, worker_queue: str, tmp_path: Path
) -> None:
    with proc_group(tmp_path) as group:
        sup, sims = start_supervisor(group, tmp_path, 4)
        a = _router(group, tmp_path, sims, "a", wait_ready=True)
        b = _router(group, tmp_path, sims, "b", "--standby-of", a.url, *STANDBY)
        before = {s.iid: process_start(s.url) for s in sims}
        handle = await start(temporal, worker_queue, plan(new_fleet("ha"), [a.url, b.url], sup))
        await until("e1 in progress", lambda: engine_state(a.url, "e1") != "active")
        a.proc.kill9()
        res = await asyncio.wait_for(handle.result(), 120)
        assert res.ok, res.message
        for iid, e in res.engines.items():
            assert e.new_process_start is not None and e.new_process_start > before[iid]
        assert supervisor_restarts(sup) == {iid: 1 for iid in before}
        doc = lifecycle(b.url)
        assert doc["router"]["controls_fleet"] is True
        assert all(e["state"] == "active" and e["accepts_new"] for e in doc["engines"].values())
