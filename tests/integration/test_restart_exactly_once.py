"""Exactly-once restarts with the ``command`` backend: ``kill -9`` of the worker at every point of a
restart — before the launch, during the command, after the command, during the wait for the new
process — and the command still ran exactly once per engine, and the rollout completes.

Real parts: Temporal dev server, ``narwhal-worker`` processes (killed with SIGKILL), router, local
supervisor with simulated engines, the restart command a real shell runs. Every kill point is
reached by waiting on an event, never on time: the command kills the worker itself at the
right moment (it knows the worker's PID), a gate in front of e0's ``/metrics`` holds the pre-launch
probe, and the e3 command leaves the engine on its old process until the test opens a gate.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from temporalio.service import RPCError

from narwhal_models.restart import SupervisorRef
from tests.integration.conftest import Temporal, start_worker, wait_ready_line
from tests.integration.restart_support import new_fleet, plan, progress, start, supervisor_restarts, until
from tests.support import loopback
from tests.support.fleet import process_start
from tests.support.lifecycle import start_stack
from tests.support.procs import Proc, ProcGroup, proc_group
from tests.support.worker_config import session_worker_config

pytestmark = pytest.mark.integration

# The restart command. Appends the engine id to `launches` first (the count the test checks), then
# acts out its kill point. `wait-gate`: the restart happens later, in the background, once the test
# creates `gate-<iid>` — the workflow meanwhile waits for the newer process.
COMMAND = r"""
import json, os, pathlib, signal, subprocess, sys, time
import httpx

iid, url, work = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
later = len(sys.argv) > 4
sup = (work / "supervisor").read_text()


def restart() -> None:
    httpx.post(f"{sup}/engines/{iid}/restart", json={}, timeout=60).raise_for_status()


def kill_worker() -> None:
    os.kill(int((work / "worker.pid").read_text()), signal.SIGKILL)


if later:
    deadline = time.monotonic() + 600  # bounded: a failed test must not leave this behind
    while not (work / f"gate-{iid}").exists():
        if time.monotonic() > deadline or not work.exists():
            sys.exit(1)
        time.sleep(0.05)
    restart()
    sys.exit(0)
with open(work / "launches", "a") as f:
    f.write(iid + "\n")
    f.flush()
    os.fsync(f.fileno())
mode = json.loads((work / "modes.json").read_text()).get(iid, "")
if mode == "kill-during":
    kill_worker()
    restart()
elif mode == "kill-after":
    restart()
    kill_worker()
elif mode == "wait-gate":
    subprocess.Popen([sys.executable, __file__, iid, url, str(work), "later"], start_new_session=True)
else:
    restart()
"""

MODES = {"e1": "kill-during", "e2": "kill-after", "e3": "wait-gate"}


class MetricsGate:
    """A pass-through proxy in front of one engine that holds the first ``GET /metrics`` (the
    pre-launch probe) until released; ``hit`` is set when it arrives."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.hit = threading.Event()
        self.release = threading.Event()
        self._first = True
        self._lock = threading.Lock()
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with gate._lock:
                    hold = self.path == "/metrics" and gate._first
                    gate._first = gate._first and not hold
                if hold:
                    gate.hit.set()
                    gate.release.wait(60)
                try:
                    r = loopback.get(gate.upstream + self.path, timeout=10)
                    status, body = r.status_code, r.content
                except httpx.HTTPError:
                    status, body = 502, b"upstream down"
                try:
                    self.send_response(status)
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the caller (a killed worker) is gone

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    @contextmanager
    def running(self) -> Iterator[MetricsGate]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.release.set()
            self.server.shutdown()
            self.server.server_close()


@contextmanager
def _gate_opened_at_exit(gate: Path) -> Iterator[None]:
    """Whatever happens, release the background e3 restart (it runs in its own session)."""
    try:
        yield
    finally:
        gate.write_text("open")


class Workers:
    """Worker processes on one task queue; the current one's PID is in ``worker.pid``."""

    def __init__(self, group: ProcGroup, t: Temporal, queue: str, work: Path) -> None:
        self.group, self.t, self.queue, self.work = group, t, queue, work
        self.started: list[Proc] = []

    def start(self) -> Proc:
        proc = start_worker(self.group, self.t, self.queue, name=f"worker-{len(self.started)}")
        wait_ready_line(proc)
        (self.work / "worker.pid").write_text(str(proc.pid))
        self.started.append(proc)
        return proc

    @property
    def current(self) -> Proc:
        return self.started[-1]

    def replace_when_dead(self) -> bool:
        if self.current.alive():
            return False
        self.start()
        return True


async def test_kill_9_of_the_worker_at_every_point_of_a_command_restart_restarts_each_engine_once(
    temporal: Temporal, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    helper = tmp_path / "restart_command.py"
    helper.write_text(COMMAND)
    (work / "modes.json").write_text(json.dumps(MODES))
    queue = f"once-{new_fleet('q')}"
    fleet = new_fleet("once")
    with proc_group(tmp_path) as group, _gate_opened_at_exit(work / "gate-e3"):
        s = start_stack(group, tmp_path, n=4)
        (work / "supervisor").write_text(s.supervisor)
        before = {sim.iid: process_start(sim.url) for sim in s.sims}
        workers = Workers(group, temporal, queue, work)
        workers.start()
        with MetricsGate(s.url("e0")).running() as gate:
            command = f"{sys.executable} {helper} {{iid}} {{url}} {work}"
            urls = {sim.iid: sim.url for sim in s.sims} | {"e0": gate.url}
            p = plan(fleet, [s.router.url], s.supervisor, engine_urls=urls)
            template = session_worker_config().add_template(command)  # the workers' configuration
            p = p.model_copy(update={"supervisor": SupervisorRef(backend="command", template=template)})
            handle = await start(temporal, queue, p)

            # 1. before the launch: e0's probe is held at the gate → kill, new worker, open the gate
            await until("e0's pre-launch probe", gate.hit.is_set, within=120)
            assert not (work / "launches").exists()
            workers.current.kill9()
            workers.start()
            gate.release.set()

            # 2./3. the e1 and e2 commands kill the worker themselves (during / after the command)
            for iid in ("e1", "e2"):
                await until(f"the {iid} command to kill the worker", lambda: not workers.current.alive(), 180)
                workers.start()

            # 4. during the wait for e3's new process
            async def e3_waiting() -> bool:
                try:
                    p = await progress(handle)
                except RPCError:  # the query may wait for the killed worker's sticky queue to time out
                    return False
                return p.engines["e3"].step == "waiting_for_new_process"

            await until("e3 waiting for its new process", e3_waiting, within=180)
            workers.current.kill9()
            workers.start()
            (work / "gate-e3").write_text("open")
            res = await handle.result()

        launches = (work / "launches").read_text().split()
        assert sorted(launches) == ["e0", "e1", "e2", "e3"], launches  # each command ran exactly once
        assert res.ok, res.message
        for iid, e in res.engines.items():
            assert e.outcome == "restarted", (iid, e)
            assert e.new_process_start is not None and e.new_process_start > before[iid]
        assert supervisor_restarts(s.supervisor) == {iid: 1 for iid in before}
        assert len(workers.started) == 5  # four kills, four replacements
