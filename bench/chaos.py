"""Chaos drill: steady client load on an HA router pair while rolling restarts run, with seeded
kill -9 faults of the worker, the active router, an engine, or the Temporal dev server.

Stack (all on 127.0.0.1, every process started here and stopped by PID):
Temporal dev server (``--db-filename`` in the drill directory) · ``narwhal-worker`` ·
``narwhal-supervisor`` owning ``--engines`` simulated engines · two ``narwhal-serve`` on one shared
lease (r0 primary, r1 ``--standby-of`` r0) · rolling restarts started with ``narwhal-restart start``
one after another until ``--duration`` is over (the last one is waited for, bounded).

Faults (one at a time, at seeded random moments, kinds cycled in a seeded order):

* ``worker``   — SIGKILL the worker, start a new one after a short pause.
                 Recovered: the new worker logged ready.
* ``router``   — SIGKILL the router currently answering ``/ready`` 200. Recovered: the other router
                 answers ``/ready`` 200 (takeover); the killed one is restarted as ``--standby-of``
                 the new holder.
* ``engine``   — SIGKILL an engine that is in placement and not held by the lifecycle (pid from the
                 supervisor), then ``POST /engines/<iid>/start`` (not a restart: does not count).
                 Recovered: the active router's lifecycle document shows it ``accepts_new`` again.
* ``temporal`` — SIGKILL the dev server, start it again on the same ports and ``--db-filename``.
                 Recovered: a client connects.

Client: ``--concurrency`` closed-loop streams; a request refused before any byte (connection
refused/reset, 503 from a standby) is retried on the other router within a 10 s budget (what a
load balancer with health checks does) — masked. Whatever still fails is recorded and attributed
to a fault when it was in flight during that fault's window (kill → recovered + 2 s) and the fault
can cut a stream (router, engine). Anything else is *unattributed*.

Invariants (exit status 1 when violated):

* duplicated restarts = Σ max(0, supervisor ``restarts[iid]`` − restarts of ``iid`` reported by the
  completed workflows) must be 0;
* lifecycle holds lost must be 0: sampled every 0.2 s from whichever router is active, an engine
  seen in a hold state must never be seen accepting new work without a ``readmitted`` event for it
  after the hold started (nor be in a hold state while ``accepts_new``);
* unattributed client failures must be 0.

    .venv/bin/python bench/chaos.py --short --json bench/results/chaos-short.json
    .venv/bin/python bench/chaos.py --duration 300 --engines 8 --seed 7 --faults worker,router,engine,temporal
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shlex
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import MODEL, RequestFailed, completion_body, new_session, pct, stream_completion
from fleet.fleetgen import fleet_document, supervisor_config
from fleet.testing.procs import Proc, ProcGroup, free_port, proc_group, script
from fleet.testing.temporal import dev_server_path

HOST = "127.0.0.1"
NAMESPACE = "default"
TASK_QUEUE = "narwhal-restart"
FLEET_NAME = "chaos"
HOLD_STATES = frozenset({"draining", "drained", "deadline_exceeded", "validating", "blocked"})
FAULT_KINDS = ("worker", "router", "engine", "temporal")
# which faults can cut a client stream (and so explain a failed request)
CUTS_STREAMS = frozenset({"router", "engine"})
ATTRIBUTION_GRACE_S = 2.0
RETRY_BUDGET_S = 10.0


@dataclass
class Fault:
    kind: str
    target: str
    at: float  # drill clock (s since start)
    recovered_at: float | None = None
    detail: str = ""

    @property
    def recovery_s(self) -> float | None:
        return None if self.recovered_at is None else self.recovered_at - self.at


@dataclass
class Failure:
    start: float
    end: float
    kind: str
    detail: str
    router: str
    fault: str = ""  # "<kind>#<index>" when attributed


@dataclass
class HoldViolation:
    at: float
    iid: str
    router: str
    why: str


@dataclass
class Timings:
    lease_ttl: float = 2.0
    lease_renew_interval: float = 0.4
    lease_safety_margin: float = 0.5
    standby_probe_interval: float = 0.1
    standby_takeover_after: int = 3
    monitor_interval: float = 0.2
    poll_interval: float = 0.2


@dataclass
class Stack:
    """The drill's processes; synchronous helpers run in threads from the async drill."""

    tmp: Path
    group: ProcGroup
    n_engines: int
    sim_opts: dict[str, Any]
    t: Timings = field(default_factory=Timings)
    temporal_ports: dict[str, int] = field(default_factory=dict)
    supervisor_url: str = ""
    router_ports: list[int] = field(default_factory=list)
    routers: list[Proc | None] = field(default_factory=list)
    worker: Proc | None = None
    temporal: Proc | None = None
    supervisor: Proc | None = None
    iids: list[str] = field(default_factory=list)
    roles: dict[str, str] = field(default_factory=dict)
    engine_urls: dict[str, str] = field(default_factory=dict)

    # -- addresses --------------------------------------------------------------------------
    @property
    def temporal_address(self) -> str:
        return f"{HOST}:{self.temporal_ports['grpc']}"

    def router_url(self, i: int) -> str:
        return f"http://{HOST}:{self.router_ports[i]}"

    @property
    def router_urls(self) -> list[str]:
        return [self.router_url(i) for i in range(len(self.router_ports))]

    # -- temporal -----------------------------------------------------------------------------
    def start_temporal(self) -> None:
        if not self.temporal_ports:
            self.temporal_ports = {k: free_port() for k in ("grpc", "http", "metrics", "ui")}
        p = self.temporal_ports
        args = [
            dev_server_path(), "server", "start-dev", "--headless", "--ip", HOST,
            "--port", str(p["grpc"]), "--http-port", str(p["http"]), "--metrics-port", str(p["metrics"]),
            "--ui-port", str(p["ui"]), "--db-filename", str(self.tmp / "temporal.db"),
            "--namespace", NAMESPACE, "--log-level", "error",
            "--search-attribute", "NarwhalFleet=Keyword", "--search-attribute", "NarwhalState=Keyword",
            "--dynamic-config-value", "frontend.enableUpdateWorkflowExecution=true",
            "--dynamic-config-value", "frontend.enableUpdateWorkflowExecutionAsyncAccepted=true",
        ]  # fmt: skip
        self.temporal = self.group.start("temporal", args)

    async def wait_temporal(self, within_s: float = 60.0) -> None:
        from workflows.client import connect, ensure_search_attributes

        deadline = time.monotonic() + within_s
        last = ""
        while time.monotonic() < deadline:
            if self.temporal is not None and not self.temporal.alive():
                raise RuntimeError(f"temporal exited:\n{self.temporal.output()[-2000:]}")
            try:
                client = await connect(self.temporal_address, NAMESPACE)
                await ensure_search_attributes(client, NAMESPACE)
                return
            except Exception as exc:  # not up yet
                last = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(0.2)
        raise TimeoutError(f"temporal not ready after {within_s}s ({last})")

    # -- worker -------------------------------------------------------------------------------
    def start_worker(self) -> Proc:
        args = [
            script("narwhal-worker"), "--address", self.temporal_address, "--namespace", NAMESPACE,
            "--task-queue", TASK_QUEUE, "--grace", "2", "--log-level", "WARNING",
        ]  # fmt: skip
        self.worker = self.group.start("worker", args)
        return self.worker

    async def wait_worker(self, within_s: float = 60.0) -> None:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            assert self.worker is not None
            if "narwhal-worker ready" in self.worker.output():
                return
            if not self.worker.alive():
                raise RuntimeError(f"worker exited:\n{self.worker.output()[-2000:]}")
            await asyncio.sleep(0.1)
        raise TimeoutError("worker not ready")

    # -- supervisor + engines -----------------------------------------------------------------
    def start_supervisor(self) -> None:
        ports = [free_port() for _ in range(self.n_engines)]
        self.iids = [f"e{i}" for i in range(self.n_engines)]
        n_prefill = self.n_engines // 2
        self.roles = {iid: ("prefill" if i < n_prefill else "decode") for i, iid in enumerate(self.iids)}
        self.engine_urls = {iid: f"http://{HOST}:{p}" for iid, p in zip(self.iids, ports, strict=True)}
        cfg = supervisor_config(
            list(zip(self.iids, ports, strict=True)), model=MODEL, health_timeout_s=180.0, stop_grace_s=5.0,
            **self.sim_opts,
        )  # fmt: skip
        (self.tmp / "supervisor.json").write_text(json.dumps(cfg, indent=2))
        port = free_port()
        self.supervisor_url = f"http://{HOST}:{port}"
        args = [
            script("narwhal-supervisor"), "--config", str(self.tmp / "supervisor.json"),
            "--host", HOST, "--port", str(port), "--log-level", "WARNING",
        ]  # fmt: skip
        self.supervisor = self.group.start("supervisor", args)

    async def supervisor_engines(self) -> dict[str, dict[str, Any]]:
        async with httpx.AsyncClient(timeout=10.0) as http:
            r = await http.get(self.supervisor_url + "/engines")
            r.raise_for_status()
            doc: dict[str, dict[str, Any]] = r.json()["engines"]
            return doc

    # -- routers ------------------------------------------------------------------------------
    def write_fleets(self) -> None:
        extra = {
            "controller": {"monitor_interval_s": self.t.monitor_interval},
            "recovery": {"readmit_every": 2, "liveness_every": 2},
        }
        for i in range(2):
            doc = fleet_document(
                [(iid, self.engine_urls[iid], self.roles[iid]) for iid in self.iids], MODEL,
                policy="individual", state_path=self.tmp / f"state-r{i}.json", extra=extra,
            )  # fmt: skip
            (self.tmp / f"fleet-r{i}.json").write_text(json.dumps(doc, indent=2))
        self.router_ports = [free_port(), free_port()]
        self.routers = [None, None]

    def start_router(self, i: int, standby_of: str = "") -> Proc:
        t = self.t
        args = [
            script("narwhal-serve"), "--fleet", str(self.tmp / f"fleet-r{i}.json"), "--host", HOST,
            "--port", str(self.router_ports[i]), "--journal", str(self.tmp / f"journal-r{i}.jsonl"),
            "--log-level", "warning", "--lease-path", str(self.tmp / "router.lease"), "--router-id", f"r{i}",
            "--lease-ttl", str(t.lease_ttl), "--lease-renew-interval", str(t.lease_renew_interval),
            "--lease-safety-margin", str(t.lease_safety_margin),
            "--standby-probe-interval", str(t.standby_probe_interval),
            "--standby-takeover-after", str(t.standby_takeover_after), "--graceful-timeout", "5",
        ]  # fmt: skip
        if standby_of:
            args += ["--standby-of", standby_of]
        proc = self.group.start(f"router-r{i}", args)
        self.routers[i] = proc
        return proc

    async def router_ready(self, http: httpx.AsyncClient, i: int) -> int:
        """/ready status of router i (0 when it does not answer)."""
        try:
            return (await http.get(self.router_url(i) + "/ready", timeout=1.0)).status_code
        except httpx.HTTPError:
            return 0

    async def wait_router(self, i: int, ok: tuple[int, ...], within_s: float = 60.0) -> None:
        deadline = time.monotonic() + within_s
        async with httpx.AsyncClient() as http:
            while time.monotonic() < deadline:
                proc = self.routers[i]
                if proc is not None and not proc.alive():
                    raise RuntimeError(f"router r{i} exited:\n{proc.output()[-2000:]}")
                if await self.router_ready(http, i) in ok:
                    return
                await asyncio.sleep(0.05)
        raise TimeoutError(f"router r{i} not answering /ready {ok}")

    async def active_router(self, http: httpx.AsyncClient) -> int | None:
        for i in range(2):
            if await self.router_ready(http, i) == 200:
                return i
        return None

    def restart_args(self) -> list[str]:
        args = [
            script("narwhal-restart"), "start", "--router", self.router_url(0), "--router", self.router_url(1),
            "--supervisor", "local", "--supervisor-url", self.supervisor_url, "--mode", "rolling",
            "--fleet", FLEET_NAME, "--address", self.temporal_address,
            "--namespace", NAMESPACE, "--task-queue", TASK_QUEUE,
            "--poll-interval", str(self.t.poll_interval), "--requested-by", "chaos-drill",
        ]  # fmt: skip
        return args

    async def bring_up(self) -> None:
        self.start_temporal()
        self.start_supervisor()
        await self.wait_temporal()
        self.start_worker()
        assert self.supervisor is not None
        await _wait_http(self.supervisor_url + "/health", self.supervisor, within_s=240.0)
        self.write_fleets()
        self.start_router(0)
        await self.wait_router(0, (200,))
        self.start_router(1, standby_of=self.router_url(0))
        await self.wait_router(1, (503,))
        await self.wait_worker()


async def _wait_http(url: str, proc: Proc, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    async with httpx.AsyncClient() as http:
        while time.monotonic() < deadline:
            if not proc.alive():
                raise RuntimeError(f"process exited before {url} answered:\n{proc.output()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(url, timeout=1.0)).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    raise TimeoutError(f"{url} not answering after {within_s}s")


# -- the drill --------------------------------------------------------------------------------------


class Drill:
    def __init__(self, stack: Stack, a: argparse.Namespace) -> None:
        self.s = stack
        self.a = a
        self.rng = random.Random(a.seed)
        self.t0 = time.monotonic()
        self.stop_load = asyncio.Event()
        self.stop_faults = asyncio.Event()
        self.faults: list[Fault] = []
        self.failures: list[Failure] = []
        self.ok_requests = 0
        self.masked_retries = 0
        self.latencies: list[float] = []
        self.holds: dict[str, float] = {}  # iid -> wall time the hold was first seen
        self.hold_violations: list[HoldViolation] = []
        self.readmitted_seen: Counter[str] = Counter()
        self.samples = 0
        self.sample_errors = 0
        self.workflows: list[dict[str, Any]] = []
        self.preferred = 0  # which router the client tries first
        self.restarting_now: set[str] = set()

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- client load ----------------------------------------------------------------------------
    async def client(self, session: aiohttp.ClientSession) -> None:
        body = completion_body("chaos drill steady load", self.a.max_tokens)
        while not self.stop_load.is_set():
            start = self.now()
            deadline = start + RETRY_BUDGET_S
            router = self.preferred
            while True:
                url = self.s.router_url(router)
                try:
                    await stream_completion(session, url, body)
                    self.ok_requests += 1
                    self.latencies.append(self.now() - start)
                    break
                except RequestFailed as exc:
                    refused = exc.kind in ("connect", "disconnect") or exc.kind == "http_503"
                    if refused and self.now() < deadline:
                        self.masked_retries += 1
                        router = 1 - router
                        self.preferred = router
                        await asyncio.sleep(0.05)
                        continue
                    self.failures.append(Failure(start, self.now(), exc.kind, exc.detail[:200], f"r{router}"))
                    break
            await asyncio.sleep(self.a.think_s)

    # -- lifecycle sampler ----------------------------------------------------------------------
    async def sampler(self) -> None:
        async with httpx.AsyncClient() as http:
            while not self.stop_load.is_set():
                await asyncio.sleep(0.2)
                for i in (self.preferred, 1 - self.preferred):
                    try:
                        r = await http.get(self.s.router_url(i) + "/narwhal/lifecycle", timeout=2.0)
                        doc = r.json()
                    except (httpx.HTTPError, ValueError):
                        continue
                    if r.status_code == 200 and doc.get("router", {}).get("controls_fleet"):
                        self.check_holds(doc, f"r{i}")
                        self.samples += 1
                        break
                else:
                    self.sample_errors += 1

    def check_holds(self, doc: dict[str, Any], router: str) -> None:
        readmit_at: dict[str, float] = {}
        for ev in doc.get("events", []):
            if ev.get("action") == "readmitted" and ev.get("iid"):
                readmit_at[ev["iid"]] = max(readmit_at.get(ev["iid"], 0.0), float(ev.get("at", 0.0)))
        for iid, e in doc.get("engines", {}).items():
            held = e.get("state") in HOLD_STATES or e.get("draining")
            if held:
                if e.get("accepts_new"):
                    self.hold_violations.append(
                        HoldViolation(self.now(), iid, router, "held but accepts_new")
                    )
                self.holds.setdefault(iid, time.time())
                continue
            since = self.holds.pop(iid, None)
            if since is None:
                continue
            # the hold ended: only a readmission (after the hold began) may end it
            if readmit_at.get(iid, 0.0) >= since - 5.0:
                self.readmitted_seen[iid] += 1
            else:
                why = f"hold ended ({e.get('state')}, accepts_new={e.get('accepts_new')}) without readmission"
                self.hold_violations.append(HoldViolation(self.now(), iid, router, why))

    # -- restarts -------------------------------------------------------------------------------
    async def restarts(self) -> None:
        k = 0
        while self.now() < self.a.duration:
            k += 1
            started = self.now()
            wid = await self.start_workflow()
            if not wid:
                continue
            res = await self.wait_workflow(wid)
            res["workflow_id"] = wid
            res["started_at"] = started
            res["finished_at"] = self.now()
            self.workflows.append(res)
            print(
                f"[{self.now():6.1f}] restart #{k} {wid}: {res.get('state')} {res.get('message', '')}",
                flush=True,
            )

    async def start_workflow(self) -> str:
        """``narwhal-restart start`` (retried while Temporal is down); the workflow ID it printed."""
        hard = self.a.duration + self.a.tail
        while self.now() < hard:
            proc = await asyncio.create_subprocess_exec(
                *self.s.restart_args(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
            )
            out, _ = await proc.communicate()
            text = out.decode(errors="replace")
            m = re.search(r"^started (\S+)", text, re.M)
            if proc.returncode == 0 and m:
                return m.group(1)
            running = re.search(r"already running \((\S+?)\)", text)
            if running:  # our earlier start got through before Temporal died: follow that one
                return running.group(1)
            print(
                f"[{self.now():6.1f}] narwhal-restart start failed ({proc.returncode}): {text[-300:]}",
                flush=True,
            )
            await asyncio.sleep(1.0)
        return ""

    async def wait_workflow(self, wid: str) -> dict[str, Any]:
        from temporalio.client import WorkflowFailureError

        from workflows.client import connect
        from workflows.models import RestartResult

        hard = self.a.duration + self.a.tail
        while self.now() < hard:
            try:
                client = await connect(self.s.temporal_address, NAMESPACE)
                handle = client.get_workflow_handle(wid, result_type=RestartResult)
                remaining = max(1.0, hard - self.now())
                res = await asyncio.wait_for(handle.result(), timeout=remaining)
                return dict(res.model_dump(mode="json", by_alias=True))
            except WorkflowFailureError as exc:
                return {"state": "failed", "ok": False, "message": str(exc), "engines": {}}
            except TimeoutError:
                break
            except Exception as exc:  # Temporal down / restarting: reconnect
                print(f"[{self.now():6.1f}] waiting for {wid}: {type(exc).__name__}: {exc}", flush=True)
                await asyncio.sleep(1.0)
        return {"state": "unfinished", "ok": False, "message": "not finished within the drill", "engines": {}}

    # -- faults ---------------------------------------------------------------------------------
    async def injector(self) -> None:
        kinds = list(self.a.faults)
        self.rng.shuffle(kinds)
        order = 0
        await asyncio.sleep(self.rng.uniform(*self.a.first_fault))
        while not self.stop_faults.is_set() and self.now() < self.a.duration and kinds:
            kind = kinds[order % len(kinds)]
            order += 1
            try:
                await getattr(self, f"fault_{kind}")()
            except Exception as exc:
                print(f"[{self.now():6.1f}] fault {kind} errored: {type(exc).__name__}: {exc}", flush=True)
                if self.faults and self.faults[-1].kind == kind and not self.faults[-1].detail:
                    self.faults[-1].detail = f"error: {type(exc).__name__}: {exc}"
            await asyncio.sleep(self.rng.uniform(*self.a.gap))

    def _fault(self, kind: str, target: str) -> Fault:
        f = Fault(kind, target, self.now())
        self.faults.append(f)
        print(f"[{f.at:6.1f}] FAULT {kind} {target}", flush=True)
        return f

    def _recovered(self, f: Fault) -> None:
        f.recovered_at = self.now()
        print(f"[{f.recovered_at:6.1f}] recovered {f.kind} {f.target} in {f.recovery_s:.2f}s", flush=True)

    async def fault_worker(self) -> None:
        assert self.s.worker is not None
        f = self._fault("worker", f"pid {self.s.worker.pid}")
        await asyncio.to_thread(self.s.worker.kill9)
        await asyncio.sleep(self.rng.uniform(0.5, 2.0))
        self.s.start_worker()
        await self.s.wait_worker()
        self._recovered(f)

    async def fault_temporal(self) -> None:
        assert self.s.temporal is not None
        f = self._fault("temporal", f"pid {self.s.temporal.pid}")
        await asyncio.to_thread(self.s.temporal.kill9)
        await asyncio.sleep(self.rng.uniform(0.5, 2.0))
        self.s.start_temporal()
        await self.s.wait_temporal()
        self._recovered(f)

    async def fault_router(self) -> None:
        async with httpx.AsyncClient() as http:
            active = await self.s.active_router(http)
        if active is None:
            print(f"[{self.now():6.1f}] router fault skipped: no active router", flush=True)
            return
        proc = self.s.routers[active]
        assert proc is not None
        other = 1 - active
        f = self._fault("router", f"r{active} pid {proc.pid}")
        await asyncio.to_thread(proc.kill9)
        await self.s.wait_router(other, (200,), within_s=60.0)
        self._recovered(f)
        f.detail = f"r{other} took over"
        await asyncio.sleep(self.rng.uniform(0.2, 1.0))
        self.s.start_router(active, standby_of=self.s.router_url(other))
        await self.s.wait_router(active, (503,), within_s=60.0)

    async def fault_engine(self) -> None:
        engines = await self.s.supervisor_engines()
        doc = await self.lifecycle_doc()
        if doc is None:
            print(f"[{self.now():6.1f}] engine fault skipped: no lifecycle document", flush=True)
            return
        views = doc.get("engines", {})
        candidates = []
        for iid, e in sorted(views.items()):
            if not e.get("accepts_new") or e.get("state") != "active" or not engines.get(iid, {}).get("pid"):
                continue
            role = self.s.roles[iid]
            peers = [
                j for j, v in views.items() if j != iid and self.s.roles[j] == role and v.get("accepts_new")
            ]
            if peers:  # never the last engine of its role in placement
                candidates.append(iid)
        if not candidates:
            print(f"[{self.now():6.1f}] engine fault skipped: no safe victim", flush=True)
            return
        iid = self.rng.choice(candidates)
        pid = int(engines[iid]["pid"])
        f = self._fault("engine", f"{iid} pid {pid}")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(self.rng.uniform(0.5, 2.0))
        async with httpx.AsyncClient(timeout=120.0) as http:
            r = await http.post(f"{self.s.supervisor_url}/engines/{iid}/start")
            f.detail = f"supervisor start: HTTP {r.status_code} {r.text[:120]}"
        deadline = self.now() + 60.0
        while self.now() < deadline:
            doc = await self.lifecycle_doc()
            if doc is not None and doc.get("engines", {}).get(iid, {}).get("accepts_new"):
                self._recovered(f)
                return
            await asyncio.sleep(0.1)

    async def lifecycle_doc(self) -> dict[str, Any] | None:
        async with httpx.AsyncClient() as http:
            for i in (self.preferred, 1 - self.preferred):
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    r = await http.get(self.s.router_url(i) + "/narwhal/lifecycle", timeout=2.0)
                    doc: dict[str, Any] = r.json()
                    if r.status_code == 200 and doc.get("router", {}).get("controls_fleet"):
                        return doc
        return None

    # -- run + report ---------------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        async with new_session(self.a.concurrency) as session:
            clients = [asyncio.create_task(self.client(session)) for _ in range(self.a.concurrency)]
            sampler = asyncio.create_task(self.sampler())
            injector = asyncio.create_task(self.injector())
            try:
                await self.restarts()
            finally:
                self.stop_faults.set()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(injector, timeout=90.0)
                injector.cancel()
                self.stop_load.set()
                await asyncio.gather(*clients, sampler, return_exceptions=True)
        return await self.report()

    def attribute(self) -> None:
        """A failure is explained by a fault that was under way while the request was in flight
        (kill → recovered + grace) and can produce it: the killed router for anything its clients
        saw; a killed engine for an error the router relayed (HTTP 5xx or an error event/cut stream)."""
        for fl in self.failures:
            for n, f in enumerate(self.faults):
                end = (f.recovered_at if f.recovered_at is not None else self.now()) + ATTRIBUTION_GRACE_S
                if not (fl.start <= end and fl.end >= f.at - 0.05):
                    continue
                if f.kind == "router" and f.target.split()[0] == fl.router:
                    fl.fault = f"router#{n}"
                elif f.kind == "engine" and (fl.kind.startswith("http_5") or fl.kind.startswith("stream_")):
                    fl.fault = f"engine#{n}"
                if fl.fault:
                    break

    async def report(self) -> dict[str, Any]:
        self.attribute()
        sup = await self.s.supervisor_engines()
        sup_restarts = {iid: int(e.get("restarts", 0)) for iid, e in sup.items()}
        wf_restarts: Counter[str] = Counter()
        for w in self.workflows:
            for iid, e in (w.get("engines") or {}).items():
                if e.get("outcome") == "restarted" or e.get("restarted_by_us"):
                    wf_restarts[iid] += 1
        duplicated = {iid: n - wf_restarts[iid] for iid, n in sup_restarts.items() if n > wf_restarts[iid]}
        missing = {iid: wf_restarts[iid] - n for iid, n in sup_restarts.items() if n < wf_restarts[iid]}
        unattributed = [f for f in self.failures if not f.fault]
        recovery: dict[str, list[float]] = {}
        for f in self.faults:
            if f.recovery_s is not None:
                recovery.setdefault(f.kind, []).append(round(f.recovery_s, 3))
        return {
            "schema": "narwhal.chaos-report",
            "seed": self.a.seed,
            "duration_s": round(self.now(), 1),
            "engines": self.s.n_engines,
            "faults_enabled": list(self.a.faults),
            "client": {
                "ok": self.ok_requests,
                "failed": len(self.failures),
                "masked_retries": self.masked_retries,
                "p50_ms": round(pct(self.latencies, 50) * 1e3, 1),
                "p99_ms": round(pct(self.latencies, 99) * 1e3, 1),
                "failed_by_fault": dict(Counter(f.fault.split("#")[0] for f in self.failures if f.fault)),
                "failed_by_kind": dict(Counter(f.kind for f in self.failures)),
            },
            "failures": [asdict(f) for f in self.failures],
            "unattributed_failures": len(unattributed),
            "restarts_completed": sum(wf_restarts.values()),
            "workflows": [
                {
                    "state": w.get("state"),
                    "ok": w.get("ok"),
                    "message": w.get("message", ""),
                    "restarted": sorted(
                        iid for iid, e in (w.get("engines") or {}).items() if e.get("outcome") == "restarted"
                    ),
                    "outcomes": {iid: e.get("outcome") for iid, e in (w.get("engines") or {}).items()},
                    "seconds": round(w["finished_at"] - w["started_at"], 2),
                }
                for w in self.workflows
            ],
            "supervisor_restarts": sup_restarts,
            "workflow_restarts": dict(wf_restarts),
            "duplicated_restarts": sum(duplicated.values()),
            "duplicated_detail": duplicated,
            "restarts_missing_at_supervisor": missing,
            "holds_lost": len(self.hold_violations),
            "hold_violations": [asdict(h) for h in self.hold_violations],
            "holds_seen_readmitted": dict(self.readmitted_seen),
            "lifecycle_samples": self.samples,
            "lifecycle_sample_misses": self.sample_errors,
            "faults": [asdict(f) | {"recovery_s": f.recovery_s} for f in self.faults],
            "recovery_s": recovery,
        }


def passed(report: dict[str, Any]) -> bool:
    keys = ("duplicated_restarts", "holds_lost", "unattributed_failures")
    return all(int(report[k]) == 0 for k in keys)


def _wf_brief(w: dict[str, Any]) -> str:
    return f"{w['state']} {w['seconds']}s"


def summary_text(r: dict[str, Any]) -> str:
    c = r["client"]
    lines = [
        f"chaos drill seed {r['seed']}: {r['duration_s']} s, {r['engines']} engines, faults {','.join(r['faults_enabled'])}",
        f"client: {c['ok']} ok, {c['failed']} failed (by fault {c['failed_by_fault']}, by kind "
        f"{c['failed_by_kind']}), {c['masked_retries']} masked retries, p50 {c['p50_ms']} ms p99 {c['p99_ms']} ms",
        f"unattributed failures: {r['unattributed_failures']}",
        f"restarts completed: {r['restarts_completed']} over {len(r['workflows'])} workflows "
        f"({', '.join(_wf_brief(w) for w in r['workflows'])})",
        f"duplicated restarts: {r['duplicated_restarts']} (supervisor {r['supervisor_restarts']})",
        f"lifecycle holds lost: {r['holds_lost']} ({r['lifecycle_samples']} samples)",
        "faults: "
        + "; ".join(
            f"{f['kind']} {f['target']} at {f['at']:.1f}s → "
            + (f"recovered in {f['recovery_s']:.2f}s" if f["recovery_s"] is not None else "NOT recovered")
            for f in r["faults"]
        ),
        "PASS" if passed(r) else "FAIL",
    ]
    return "\n".join(lines)


# -- rolling restart timing for bench/scale.py ------------------------------------------------------


async def _timed_restart(stack: Stack, n: int, mode: str, timeout_s: float) -> dict[str, Any]:
    t_up = time.monotonic()
    await stack.bring_up()
    up_s = time.monotonic() - t_up
    args = [a if a != "rolling" else mode for a in stack.restart_args()] + ["--wait"]
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    timed_out = False
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        timed_out = True
        proc.kill()  # by PID (the CLI only waits; the workflow keeps its state in Temporal)
        out, _ = await proc.communicate()
    total = time.monotonic() - t0
    sup = await stack.supervisor_engines()
    return {
        "bring_up_s": up_s,
        "total_s": total,
        "timed_out": timed_out,
        "rc": proc.returncode,
        "output": out.decode(errors="replace"),
        "supervisor_restarts": sum(int(e.get("restarts", 0)) for e in sup.values()),
        "per_engine": journal_restart_times(stack.tmp),
    }


def journal_restart_times(tmp: Path) -> dict[str, dict[str, float | None]]:
    """Per engine: seconds from ``drain_started`` to ``readmitted`` (None: never readmitted), from
    both routers' journals."""
    start: dict[str, float] = {}
    done: dict[str, float] = {}
    for path in sorted(tmp.glob("journal-r*.jsonl")):
        for line in path.read_text().splitlines():
            if '"engine_lifecycle"' not in line:
                continue
            row = json.loads(line)
            iid, action = row.get("iid"), row.get("action")
            if action == "drain_started" and iid:
                start[iid] = min(start.get(iid, row["at"]), row["at"])
            elif action == "readmitted" and iid:
                done[iid] = max(done.get(iid, row["at"]), row["at"])
    return {
        iid: {"drain_at": t, "seconds": (done[iid] - t) if iid in done else None} for iid, t in start.items()
    }


def rolling_restart_timing(n: int, mode: str = "rolling", timeout_s: float = 900.0) -> str:
    """Bring up the stack with ``n`` sims, run one restart with ``--wait`` (bounded by ``timeout_s``),
    report total and per-engine time (markdown)."""
    with tempfile.TemporaryDirectory(prefix="scale-restart.") as tmpdir, proc_group(Path(tmpdir)) as group:
        stack = Stack(Path(tmpdir), group, n, {"ttft_base_ms": 2.0, "itl_ms": 1.0, "max_concurrency": 256})
        res = asyncio.run(_timed_restart(stack, n, mode, timeout_s))
    per = res["per_engine"]
    secs = sorted(v["seconds"] for v in per.values() if v["seconds"] is not None)
    stuck = sorted(iid for iid, v in per.items() if v["seconds"] is None)
    lines = [
        f"Rolling restart ({mode}) of {n} simulated engines end to end "
        f"(supervisor + HA router pair + Temporal dev server + worker, `narwhal-restart start --wait`):",
        "",
        f"- stack bring-up: {res['bring_up_s']:.1f} s",
        f"- restart: {res['total_s']:.1f} s {'(TIMED OUT) ' if res['timed_out'] else ''}"
        f"exit {res['rc']}; {len(secs)} of {n} engines readmitted, supervisor restarts {res['supervisor_restarts']}",
    ]
    if secs:
        lines.append(
            f"- per engine (drain → readmitted): median {statistics.median(secs):.1f} s, "
            f"min {secs[0]:.1f} s, max {secs[-1]:.1f} s; {res['total_s'] / max(1, len(secs)):.2f} s of wall time per engine"
        )
    if stuck:
        lines.append(f"- drained but never readmitted: {', '.join(stuck)}")
    lines += ["", "```", res["output"].strip()[-3000:], "```"]
    return "\n".join(lines)


def _terminate(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=180.0, help="seconds of faults + restarts")
    ap.add_argument("--tail", type=float, default=120.0, help="max extra seconds for the last restart")
    ap.add_argument("--engines", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--faults", type=lambda s: [x for x in s.split(",") if x], default=list(FAULT_KINDS))
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--think-s", type=float, default=0.02)
    ap.add_argument("--short", action="store_true", help="CI configuration (≤ ~90 s)")
    ap.add_argument("--json", default="", help="write the JSON report here")
    ap.add_argument("--keep", default="", help="keep the drill directory (logs, db) here")
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)  # stop every child by PID on the way out
    unknown = set(a.faults) - set(FAULT_KINDS)
    if unknown:
        ap.error(f"unknown faults {sorted(unknown)} (choose from {','.join(FAULT_KINDS)})")
    a.first_fault = (2.0, 5.0)
    a.gap = (2.0, 6.0)
    if a.short:
        a.duration, a.tail, a.engines, a.concurrency = 40.0, 35.0, 6, 6
        a.first_fault, a.gap = (2.0, 4.0), (1.0, 3.0)
    print("command:", shlex.join(["python", "bench/chaos.py", *(argv if argv is not None else sys.argv[1:])]))
    sim_opts = {"ttft_base_ms": 2.0, "itl_ms": 2.0, "max_concurrency": 256}
    if a.keep:
        Path(a.keep).mkdir(parents=True, exist_ok=True)
        ctx: contextlib.AbstractContextManager[str] = contextlib.nullcontext(a.keep)
    else:
        ctx = tempfile.TemporaryDirectory(prefix="chaos.")
    with ctx as tmpdir, proc_group(Path(tmpdir)) as group:
        stack = Stack(Path(tmpdir), group, a.engines, sim_opts)

        async def go() -> dict[str, Any]:
            await stack.bring_up()
            print(f"stack up in {tmpdir}", flush=True)
            return await Drill(stack, a).run()

        report = asyncio.run(go())
    print(summary_text(report))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(report, indent=2))
    return 0 if passed(report) else 1


if __name__ == "__main__":
    sys.exit(main())
