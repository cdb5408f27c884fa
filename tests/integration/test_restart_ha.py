"""A restart keeps going when the active router dies: the activities follow the lease holder."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.integration.conftest import Temporal
from tests.integration.restart_support import (
    engine_state,
    lifecycle,
    new_fleet,
    plan,
    start,
    supervisor_restarts,
    until,
)
from tests.support.fleet import process_start, start_supervisor
from tests.support.ha import ha_router, standby_router
from tests.support.procs import proc_group

pytestmark = pytest.mark.integration


async def test_active_router_killed_mid_restart_continues_on_the_new_holder(
    temporal: Temporal, worker_queue: str, tmp_path: Path
) -> None:
    with proc_group(tmp_path) as group:
        sup, sims = start_supervisor(group, tmp_path, 4)
        a = ha_router(group, tmp_path, sims, "a", wait_ready=True)
        b = standby_router(group, tmp_path, sims, a)
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
