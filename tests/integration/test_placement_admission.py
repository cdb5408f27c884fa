"""Placement and admission through a real router over real simulated engines: equal-load ties
rotate (counted at the engines), the admission queue refuses when full (429 ``inflight_limit``),
expires waiters (504 ``queue_expired``) and hands a freed seat to the oldest waiter."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.serving_support import contract_free_fleet, wait_until
from tests.support import loopback
from tests.support.fleet import sim_stats, start_sims
from tests.support.procs import proc_group
from tests.support.router import RouterHandle, start_router

pytestmark = pytest.mark.integration
MODEL = "sim-model"


def test_sequential_requests_spread_over_equally_loaded_engines(tmp_path: Path) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 4, roles=["prefill", "prefill", "decode", "decode"])
        router = start_router(group, contract_free_fleet(tmp_path, sims), tmp_path, wait_ready=True)
        body = {"model": MODEL, "prompt": "spread", "max_tokens": 2}
        for i in range(20):
            r = router.post("/v1/completions", {**body, "stream": i % 2 == 0})
            assert r.status_code == 200, r.text
        got = {s.iid: sim_stats(s.url)["requests"] for s in sims}
        assert [got[i]["prefill"] for i in ("e0", "e1")] == [10, 10]
        assert [got[i]["decode"] for i in ("e2", "e3")] == [10, 10]
        assert all(got[i]["decode"] == 0 for i in ("e0", "e1"))
        assert all(got[i]["prefill"] == 0 for i in ("e2", "e3"))


class _Holder:
    """A streaming request that holds the router's only seat until ``release()``."""

    def __init__(self, router: RouterHandle) -> None:
        self.client = loopback.client(timeout=30)
        body = {"model": MODEL, "prompt": "hold", "max_tokens": 500, "stream": True}
        self.cm = self.client.stream("POST", router.url + "/v1/completions", json=body)
        self.resp = self.cm.__enter__()
        assert self.resp.status_code == 200
        self.lines = self.resp.iter_lines()
        assert next(self.lines).startswith("data: ")

    def release(self) -> None:
        self.cm.__exit__(None, None, None)
        self.client.close()


def _in_thread(router: RouterHandle, body: dict[str, Any]) -> tuple[threading.Thread, list[httpx.Response]]:
    out: list[httpx.Response] = []
    t = threading.Thread(target=lambda: out.append(router.post("/v1/completions", body, timeout=60)))
    t.start()
    return t, out


def test_admission_queue_refuses_expires_and_hands_seats_over(tmp_path: Path) -> None:
    body = {"model": MODEL, "prompt": "queued", "max_tokens": 2, "stream": False}
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 2, itl_ms=20)
        (tmp_path / "a").mkdir()
        expiring = start_router(
            group,
            contract_free_fleet(tmp_path / "a", sims, queue_capacity=1, queue_timeout_s=5.0),
            tmp_path / "a",
            extra_args=["--max-concurrent", "1"],
            wait_ready=True,
            name="expiring",
        )
        holder = _Holder(expiring)
        try:
            waiter, answers = _in_thread(expiring, body)
            wait_until(lambda: expiring.metrics()["narwhal_queued_requests"] == 1, what="a queued request")
            full = expiring.post("/v1/completions", body)
            assert full.status_code == 429 and full.headers["retry-after"] == "1"
            assert full.json()["error"]["code"] == "inflight_limit"
            waiter.join(timeout=30)
            (expired,) = answers
            assert expired.status_code == 504
            err = expired.json()["error"]
            assert err["type"] == "queue_expired" and err["code"] == "queue_timeout"
        finally:
            holder.release()
        m = wait_until(
            lambda: (mm := expiring.metrics())["narwhal_inflight_requests"] == 0 and mm, what="idle"
        )
        assert m['narwhal_rejected_total{reason="inflight_limit"}'] == 1
        assert m['narwhal_expired_total{reason="queue_timeout"}'] == 1
        rows = wait_until(
            lambda: [r for r in expiring.journal_rows() if r.get("reason") == "queue_timeout"], what="row"
        )
        assert len(rows) == 1 and rows[0]["expired"] is True and rows[0]["status"] == 504

        (tmp_path / "b").mkdir()
        waiting = start_router(
            group,
            contract_free_fleet(tmp_path / "b", sims, queue_capacity=4),
            tmp_path / "b",
            extra_args=["--max-concurrent", "1"],
            wait_ready=True,
            name="waiting",
        )
        holder = _Holder(waiting)
        try:
            waiter, answers = _in_thread(waiting, body)
            wait_until(lambda: waiting.metrics()["narwhal_queued_requests"] == 1, what="a queued request")
        finally:
            holder.release()  # the seat goes to the queued request
        waiter.join(timeout=60)
        (served,) = answers
        assert served.status_code == 200 and served.json()["choices"][0]["text"]
        m = wait_until(
            lambda: (mm := waiting.metrics())["narwhal_inflight_requests"] == 0 and mm, what="idle"
        )
        assert m["narwhal_served_total"] == 1 and m["narwhal_cancelled_total"] == 1
        assert m["narwhal_queued_requests"] == 0
        row = wait_until(
            lambda: [r for r in waiting.journal_rows() if r.get("terminal") == "completed"], what="row"
        )[-1]
        assert row["queue_wait_s"] > 0
