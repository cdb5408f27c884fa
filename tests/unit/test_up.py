"""narwhal-up's own parts: port plan and checks, roles, process manager, load generator, HA watcher,
summary. The load generator and the watcher run against small fake aiohttp routers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import web

from fleet.procs import ChildExited, ProcessManager
from fleet.up.load import LoadGenerator, LoadStats, RouterPicker
from fleet.up.main import build_parser, timings_from
from fleet.up.ports import plan_ports, port_problems
from fleet.up.stack import Timings, roles, rolling_problem
from fleet.up.summary import EngineChange, Failover, Summary, Takeover
from fleet.up.watch import HAWatcher, failover_trigger, progress_lines

# -- ports ---------------------------------------------------------------------------------------


def test_port_plan_defaults_base_and_overrides() -> None:
    p = plan_ports(None, 2, {})
    assert (p.temporal, p.ui, p.router, p.standby, p.supervisor) == (7233, 8233, 8000, 8001, 8900)
    assert p.engine_ports() == [8100, 8101]
    b = plan_ports(30000, 3, {"ui": 31000})
    assert (b.temporal, b.temporal_http, b.ui, b.supervisor, b.router, b.standby) == (
        30000, 30001, 31000, 30004, 30005, 30006,
    )  # fmt: skip
    assert b.engine_ports() == [30010, 30011, 30012]


def test_port_problems_name_the_port_and_the_flag() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        ports = plan_ports(None, 1, {"temporal": port, "router": 70000, "standby": port + 0})
        problems = port_problems(ports)
    assert f"temporal port {port} is in use; pass --temporal-port N or --base-port N" in problems
    assert any("router port 70000 is out of range" in p for p in problems)
    assert any(f"standby and temporal would both use port {port}" in p for p in problems)


def test_free_plan_has_no_problems() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
    # a plan around a just-released port: every port distinct; only a real conflict may be reported
    problems = port_problems(plan_ports(base, 2, {}))
    assert all("in use" in p for p in problems)


# -- flags, roles, timings -------------------------------------------------------------------------


def test_roles_and_rolling_feasibility() -> None:
    assert roles(4) == ["prefill", "prefill", "decode", "decode"]
    assert roles(3) == ["prefill", "decode", "decode"]
    assert roles(2, 0) == ["decode", "decode"]
    assert rolling_problem(roles(4)) == ""
    assert rolling_problem(roles(2, 0)) == ""
    assert "single prefill engine" in rolling_problem(roles(2))
    assert "single prefill engine" in rolling_problem(roles(3))


def test_fast_timings_are_valid_lease_timings_and_flags_override() -> None:
    from router.config import check_lease_timing

    for t in (Timings(), Timings.fast()):
        check_lease_timing(t.lease_ttl, t.lease_renew_interval, t.lease_safety_margin)
    args = build_parser().parse_args(["--fast", "--lease-ttl", "3", "--router-port", "9999"])
    t = timings_from(args)
    assert t.lease_ttl == 3.0 and t.poll_interval == Timings.fast().poll_interval
    assert args.router == 9999 and args.engines == 4 and args.restart == "rolling"


# -- process manager ---------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return waited == 0


async def test_process_manager_stops_by_pid_and_kills_the_group(tmp_path: Path) -> None:
    pm = ProcessManager(tmp_path, tmp_path / "pids.json")
    grandchild_file = tmp_path / "grandchild.pid"
    # a child that ignores SIGTERM and has a grandchild in its process group
    stubborn = pm.start(
        "stubborn",
        ["sh", "-c", f"trap '' TERM; sleep 60 & echo $! > {grandchild_file}; echo started; wait"],
        grace_s=0.3,
    )
    polite = pm.start(
        "polite", [sys.executable, "-c", "import time; print('hi', flush=True); time.sleep(60)"]
    )
    oneshot = pm.start("oneshot", ["true"], oneshot=True)
    deadline = time.monotonic() + 10
    while not grandchild_file.exists() or not grandchild_file.read_text().strip():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    grandchild = int(grandchild_file.read_text())
    assert await oneshot.wait(5.0) == 0
    pm.check_alive()  # a finished one-shot command is not a dead service
    doc = json.loads((tmp_path / "pids.json").read_text())
    assert doc["children"] == {"stubborn": stubborn.pid, "polite": polite.pid, "oneshot": oneshot.pid}
    assert doc["narwhal_up"] == os.getpid()
    pm.note_pids("engines", {"e0": 1234})
    assert json.loads((tmp_path / "pids.json").read_text())["engines"] == {"e0": 1234}
    await pm.stop_all(["polite"])
    assert polite.returncode == -signal.SIGTERM
    assert stubborn.returncode == -signal.SIGKILL  # grace expired → SIGKILL to its group
    assert not _alive(stubborn.pid) and not _alive(polite.pid)
    for _ in range(50):
        if not _alive(grandchild):
            break
        await asyncio.sleep(0.05)
    assert not _alive(grandchild)
    assert "=== narwhal-up starts:" in (tmp_path / "polite.log").read_text()


async def test_check_alive_reports_a_dead_service_with_its_log(tmp_path: Path) -> None:
    pm = ProcessManager(tmp_path, tmp_path / "pids.json")
    child = pm.start("crasher", ["sh", "-c", "echo boom; exit 7"])
    assert await child.wait(5.0) == 7
    with pytest.raises(ChildExited, match=r"crasher \(pid \d+\) exited with code 7(.|\n)*boom"):
        pm.check_alive()
    await pm.stop_all()


# -- fake routers ----------------------------------------------------------------------------


class FakeRouter:
    def __init__(self, ready: bool = True, epoch: int = 1, mode: str = "ok") -> None:
        self.ready = ready
        self.epoch = epoch
        self.mode = mode  # ok | no_done | http500 | http503 | stream_error
        self.requests: Counter[str] = Counter()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/ready", self.ready_route)
        app.router.add_post("/v1/completions", self.completions)
        return app

    async def ready_route(self, _: web.Request) -> web.Response:
        doc = {"status": "ready" if self.ready else "not_ready", "control_ready": self.ready,
               "epoch": self.epoch, "holder": f"h{self.epoch}", "reason": "" if self.ready else "shadowing"}  # fmt: skip
        return web.json_response(doc, status=200 if self.ready else 503)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        kind = "stream" if body.get("stream") else "buffered"
        self.requests[kind] += 1
        if self.mode == "http500":
            return web.json_response({"error": {"message": "boom", "type": "engine_error"}}, status=500)
        if self.mode == "http503":
            return web.json_response({"error": {"message": "not ready", "type": "unavailable"}}, status=503)
        if not body.get("stream"):
            return web.json_response({"choices": [{"text": "hi", "index": 0}]})
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices": [{"text": "a", "index": 0}]}\n\n')
        if self.mode == "stream_error":
            await resp.write(b'data: {"error": {"message": "engine died"}}\n\n')
        elif self.mode != "no_done":
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


@asynccontextmanager
async def serve(*routers: FakeRouter) -> AsyncIterator[list[str]]:
    runners = []
    urls = []
    try:
        for r in routers:
            runner = web.AppRunner(r.app(), access_log=None, shutdown_timeout=0.5)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            runners.append(runner)
            port = runner.addresses[0][1]
            urls.append(f"http://127.0.0.1:{port}")
        yield urls
    finally:
        for runner in runners:
            await runner.cleanup()


async def run_load(urls: list[str], until: Callable[[LoadStats], bool], **kw: Any) -> LoadGenerator:
    load = LoadGenerator(urls, "m", concurrency=2, think_s=0.005, no_router_timeout_s=0.5, **kw)
    await load.start()
    try:
        deadline = time.monotonic() + 10
        while not until(load.stats):
            assert time.monotonic() < deadline, load.stats
            await asyncio.sleep(0.02)
    finally:
        await load.stop()
    return load


# -- load generator ----------------------------------------------------------------------------


async def test_load_follows_the_ready_router_and_mixes_stream_and_buffered() -> None:
    standby, primary = FakeRouter(ready=False), FakeRouter(ready=True)
    async with serve(standby, primary) as urls:
        load = await run_load(urls, lambda s: s.served >= 20)
    s = load.stats
    assert s.failed == 0 and s.retried == 0
    assert s.streamed >= 5 and s.buffered >= 5
    assert set(s.by_router) == {urls[1]}
    assert sum(standby.requests.values()) == 0
    assert primary.requests["stream"] >= 5 and primary.requests["buffered"] >= 5


async def test_picker_moves_to_the_router_that_became_ready() -> None:
    a, b = FakeRouter(ready=True), FakeRouter(ready=False)
    async with serve(a, b) as urls, aiohttp.ClientSession() as session:
        picker = RouterPicker(session, urls)
        assert await picker.poll_once() == urls[0]
        b.ready = True
        assert await picker.poll_once() == urls[0]  # both ready: stay (no flapping)
        a.ready = False
        assert await picker.poll_once() == urls[1]
        b.ready = False
        assert await picker.poll_once() is None
        assert not picker.ready_event.is_set()
        assert await picker.wait_ready(0.05) is None
    assert [sw.router for sw in picker.switches] == [urls[0], urls[1], None]


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("no_done", "stream ended without [DONE]"),
        ("http500", "HTTP 500 engine_error: boom"),
        ("stream_error", "stream error: engine died"),
        ("http503", "HTTP 503 unavailable: not ready"),
    ],
)
async def test_load_counts_failures_with_reasons(mode: str, reason: str) -> None:
    router = FakeRouter(mode=mode)
    async with serve(router) as urls:
        load = await run_load(urls, lambda s: s.failed >= 4)
    s = load.stats
    assert s.failures[reason] == s.failed >= 4
    if mode == "http503":  # refused before answering: re-sent once, then a failure
        assert s.retried >= s.failed
    if mode in ("no_done", "stream_error"):
        assert s.served >= 1  # the buffered half still works


async def test_load_with_no_ready_router_fails_with_reason() -> None:
    async with serve(FakeRouter(ready=False)) as urls:
        load = await run_load(urls, lambda s: s.failed >= 2)
    assert "no router ready" in next(iter(load.stats.failures))


def test_load_stats_minus_is_the_window() -> None:
    a = LoadStats(served=5, failed=1, failures=Counter({"x": 1}), by_router=Counter({"r": 5}))
    b = a.copy()
    b.served, b.failed = 9, 3
    b.failures["y"] += 2
    b.by_router["r"] += 4
    d = b.minus(a)
    assert (d.served, d.failed, dict(d.failures), dict(d.by_router)) == (4, 2, {"y": 2}, {"r": 4})
    assert a.served == 5  # the snapshot is independent


# -- HA watcher ------------------------------------------------------------------------------


async def test_ha_watcher_reports_a_takeover_once() -> None:
    primary, standby = FakeRouter(ready=True, epoch=3), FakeRouter(ready=False, epoch=0)
    seen: list[Takeover] = []
    async with serve(primary, standby) as urls, httpx.AsyncClient() as http:
        w = HAWatcher({"primary": urls[0], "standby": urls[1]}, on_takeover=seen.append)
        await w.poll_once(http)
        assert (w.controller, w.epoch, w.takeovers) == ("primary", 3, [])
        primary.ready = False
        standby.ready, standby.epoch = True, 4
        await w.poll_once(http)
        await w.poll_once(http)
    assert [(t.router, t.epoch_before, t.epoch_after, t.holder) for t in w.takeovers] == [
        ("standby", 3, 4, "h4")
    ]
    assert seen == w.takeovers
    assert w.views["primary"].status == 503 and w.views["standby"].control_ready


def test_progress_lines_only_report_changes() -> None:
    eng = SimpleNamespace(
        iid="e0", step="draining", router_state="draining", error="", note="", waiting_for=""
    )
    p = SimpleNamespace(state="running", message="restarting e0", engines={"e0": eng})
    shown: dict[str, str] = {}
    first = progress_lines(p, shown)
    assert first[0] == "running: restarting e0" and "e0" in first[1] and "draining" in first[1]
    assert progress_lines(p, shown) == []
    eng.step = "restarting"
    assert len(progress_lines(p, shown)) == 1


# -- summary ---------------------------------------------------------------------------------


def _summary(**kw: Any) -> Summary:
    engines = [
        EngineChange("e0", "prefill", "restarted", 100.0, 200.0, 11, 21),
        EngineChange("e1", "decode", "restarted", 100.0, 210.0, 12, 22),
    ]
    return Summary(mode="rolling", workflow_id="wf", workflow_url="http://ui/wf", workflow_state="done",
                   engines=engines, total=LoadStats(served=50, streamed=25, buffered=25),
                   during=LoadStats(served=40), restart_seconds=3.2, **kw)  # fmt: skip


def test_summary_ok_and_rendered() -> None:
    s = _summary()
    assert s.ok and s.all_restarted
    text = s.render()
    assert "rolling restart: done in 3.2s — 2/2 engines restarted" in text
    assert "pid 11 → 21" in text
    assert "client requests during the restart: 40 served" in text
    assert "takeovers: none" in text
    assert "workflow: http://ui/wf" in text
    assert "result:   OK — 2/2 engines restarted, 0 failed requests" in text
    assert json.loads(json.dumps(s.to_json()))["ok"] is True


def test_summary_fails_on_a_failed_request_an_unrestarted_engine_or_a_problem() -> None:
    s = _summary()
    s.total.failed = 1
    s.total.failures["HTTP 502 x: y"] = 1
    assert not s.ok and "failed     1 × HTTP 502 x: y" in s.render()
    s = _summary()
    s.engines[1] = EngineChange("e1", "decode", "failed", 100.0, None, error="refused")
    assert not s.ok and "1/2 engines restarted" in s.render() and "(refused)" in s.render()
    s = _summary()
    s.engines[0].new_process_start = 50.0  # not newer: not a restart
    assert not s.all_restarted
    s = _summary(problems=["workflow failed"])
    assert not s.ok and "problem:  workflow failed" in s.render()
    assert Summary(mode="none", total=LoadStats(served=3)).ok
    assert not Summary(mode="rolling").ok  # no engines: nothing was restarted


def test_summary_lists_takeovers() -> None:
    s = _summary(takeovers=[Takeover(1e9, "standby", 1, 2, "standby:abc")])
    assert "standby took the lease, epoch 1 → 2 (standby:abc)" in s.render()


def test_summary_failover_cut_requests_are_not_failures() -> None:
    s = _summary(failover=Failover(router="primary", pid=7, killed_at=1e9, dead_at=1e9 + 0.03,
                                   trigger="e1 began draining", standby="standby",
                                   standby_ready_at=1e9 + 2.5, epoch_before=1, epoch_after=2))  # fmt: skip
    s.total.cut = 3
    s.total.cut_reasons["router disconnected mid-request"] = 3
    text = s.render()
    assert s.ok
    assert "primary router (pid 7) SIGKILLed at" in text and "when e1 began draining" in text
    assert "standby /ready 200 at" in text and "(+2.50s), lease epoch 1 → 2" in text
    assert "cut by the injected router kill: 3 requests" in text and "not counted as failures" in text
    assert "cut        3 × router disconnected mid-request" in text
    assert "0 failed requests, 3 cut by the injected router kill (not failures)" in text
    doc = json.loads(json.dumps(s.to_json()))
    assert doc["failover"]["took_s"] == pytest.approx(2.5) and doc["total"]["cut"] == 3
    s.total.failed = 1
    assert not s.ok
    missed = _summary(failover=Failover(router="primary", standby="standby"))
    assert "the primary router was not killed" in missed.render()


def test_failover_trigger_waits_for_the_second_engine() -> None:
    def eng(iid: str, step: str, started: float | None) -> SimpleNamespace:
        return SimpleNamespace(iid=iid, step=step, started_at=started)

    p = SimpleNamespace(engines={"e0": eng("e0", "draining", 1.0), "e1": eng("e1", "pending", None)})
    assert failover_trigger(p) == ""
    p.engines["e1"] = eng("e1", "draining", 2.0)
    assert failover_trigger(p) == "e1 began draining (engine 2 of 2)"


async def test_load_counts_requests_cut_by_an_injected_kill_apart() -> None:
    load = LoadGenerator(["http://127.0.0.1:1/"], "m")
    load.router_killed("http://127.0.0.1:1/")  # being killed: everything sent to it so far is cut
    assert load._cut_by_kill("http://127.0.0.1:1", time.time())
    load.router_killed("http://127.0.0.1:1", dead_at=100.0)
    assert load._cut_by_kill("http://127.0.0.1:1", 99.0)
    assert not load._cut_by_kill("http://127.0.0.1:1", 101.0)  # sent after it was gone: a failure
    assert not load._cut_by_kill("http://127.0.0.1:2", 99.0)
    a = LoadStats(cut=1, cut_reasons=Counter({"x": 1}))
    b = a.copy()
    b.cut, b.cut_reasons["x"] = 3, 3
    assert (b.minus(a).cut, dict(b.minus(a).cut_reasons)) == (2, {"x": 2})


async def test_process_manager_kill_is_not_a_crash(tmp_path: Path) -> None:
    pm = ProcessManager(tmp_path, tmp_path / "pids.json")
    pm.start("victim", [sys.executable, "-c", "import time; time.sleep(60)"])
    child = await pm.kill("victim", at=5.0)
    assert not child.alive() and child.killed_at == 5.0 and child.returncode == -signal.SIGKILL
    pm.check_alive()  # killed on purpose: not reported
    await pm.stop_all()


def test_failover_needs_a_restart(capsys: pytest.CaptureFixture[str]) -> None:
    from fleet.up.main import main

    assert main(["--failover", "--restart", "none"]) == 2
    assert "--failover kills the primary during the restart" in capsys.readouterr().err
    assert "NOT counted as failures" in " ".join(build_parser().format_help().split())


def test_bad_build_succeeds_only_when_the_canary_analysis_halts_it(tmp_path: Path) -> None:
    from fleet.up.main import main
    from fleet.up.stack import DEMO_ANALYSIS, bad_builds
    from narwhal_models.evidence import AnalysisPolicy

    AnalysisPolicy.model_validate(DEMO_ANALYSIS)  # the demo's policy file is a valid policy
    assert (
        bad_builds(1.0)["failing"]["error_rate"] == 0.2 and bad_builds(40.0)["slow"]["ttft_base_ms"] == 120.0
    )
    assert main(["--bad-build", "failing", "--restart", "wave", "--state-dir", str(tmp_path / "s")]) == 2
    halted = _summary()
    halted.expect_halt, halted.workflow_state = True, "analysis_failed"
    assert halted.ok and "the bad build was halted by the canary analysis" in halted.render()
    rolled = _summary()
    rolled.expect_halt = True  # every engine restarted onto the bad build: the demo failed
    assert not rolled.ok and "the bad build was NOT halted" in rolled.render()
