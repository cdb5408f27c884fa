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
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import RequestFailed, completion_body, new_session, pct, stream_completion
from fleet.procs import Child, stop_pid
from fleet.testing.procs import free_port
from fleet.up.ports import Ports, port_free
from fleet.up.stack import Stack as UpStack
from fleet.up.stack import Timings as UpTimings

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


def chaos_timings() -> UpTimings:
    """Fast failover timings; engines get 180 s to come up on a loaded machine."""
    return replace(
        UpTimings.fast(), monitor_interval=0.2, ttft_base_ms=2.0, itl_ms=2.0, health_timeout_s=180.0
    )


def free_plan(n_engines: int) -> Ports:
    """A narwhal-up port plan on free loopback ports (engines on consecutive free ports)."""
    while True:
        base = free_port()
        if all(port_free(base + i) for i in range(n_engines)):
            break
    names = (
        "temporal", "temporal_http", "temporal_metrics", "ui", "supervisor", "router", "standby",
        "etcd_client", "etcd_peer",
    )  # fmt: skip
    return Ports(engines=n_engines, engine_base=base, **{name: free_port() for name in names})


class Stack:
    """The drill's processes: a ``narwhal-up`` stack (``fleet/up/stack.py``) on free loopback ports,
    with router ``r0`` = its primary and ``r1`` = its standby; faults kill children by PID."""

    NAMES = ("primary", "standby")

    def __init__(self, tmp: Path, n_engines: int, sim_options: dict[str, Any]) -> None:
        self.tmp = tmp
        self.up = UpStack(tmp, free_plan(n_engines), chaos_timings(), FLEET_NAME, sim_options=sim_options)
        self.iids = self.up.iids
        self.roles = self.up.roles

    # -- addresses + children -------------------------------------------------------------------
    @property
    def temporal_address(self) -> str:
        return self.up.temporal_address

    @property
    def supervisor_url(self) -> str:
        return self.up.supervisor_url

    def router_url(self, i: int) -> str:
        return self.up.routers[self.NAMES[i]]

    @property
    def router_urls(self) -> list[str]:
        return [self.router_url(i) for i in range(2)]

    def child(self, name: str) -> Child:
        return self.up.procs.children[name]

    def router_child(self, i: int) -> Child:
        return self.child(f"router-{self.NAMES[i]}")

    async def kill(self, child: Child) -> None:
        """SIGKILL by PID (an injected fault, not a crash of the stack)."""
        await self.up.procs.kill(child.name)

    # -- components -----------------------------------------------------------------------------
    async def start_temporal(self) -> None:
        await self.up.start_temporal()

    async def start_worker(self) -> None:
        await self.up.start_worker()

    async def start_router(self, i: int, standby_of: str = "") -> None:
        await self.up.start_router(self.NAMES[i], standby_of)

    async def supervisor_engines(self) -> dict[str, dict[str, Any]]:
        return await self.up.engines()

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
                child = self.up.procs.children.get(f"router-{self.NAMES[i]}")
                if child is not None and not child.alive() and child.killed_at is None:
                    raise RuntimeError(f"router r{i} exited:\n{child.tail()}")
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
        args = self.up.restart_args("rolling")
        args[args.index("--requested-by") + 1] = "chaos-drill"
        return args

    async def bring_up(self) -> None:
        self.up.write_configs()
        await self.up.start_temporal()
        await self.up.start_supervisor()
        await self.up.start_worker()
        await self.up.start_routers()

    async def close(self) -> None:
        await self.up.procs.stop_all()

    def close_now(self) -> None:
        """Synchronous last resort (the drill was interrupted): stop every child by PID."""
        for child in reversed(list(self.up.procs.children.values())):
            stop_pid(child.popen, child.grace_s)


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
        # Not finished (a slow host): its restarts so far come from the live progress query, so the
        # duplicate count compares the supervisor with what the workflow itself did, not with zero.
        engines: dict[str, Any] = {}
        with contextlib.suppress(Exception):
            client = await connect(self.s.temporal_address, NAMESPACE)
            progress = await asyncio.wait_for(client.get_workflow_handle(wid).query("progress"), 30)
            engines = dict(progress.get("engines") or {}) if isinstance(progress, dict) else {}
        return {
            "state": "unfinished",
            "ok": False,
            "message": "not finished within the drill",
            "engines": engines,
        }

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
        worker = self.s.child("worker")
        f = self._fault("worker", f"pid {worker.pid}")
        await self.s.kill(worker)
        await asyncio.sleep(self.rng.uniform(0.5, 2.0))
        await self.s.start_worker()  # returns once the new worker logged ready
        self._recovered(f)

    async def fault_temporal(self) -> None:
        temporal = self.s.child("temporal")
        f = self._fault("temporal", f"pid {temporal.pid}")
        await self.s.kill(temporal)
        await asyncio.sleep(self.rng.uniform(0.5, 2.0))
        await self.s.start_temporal()  # same ports and --db-filename; returns once a client connects
        self._recovered(f)

    async def fault_router(self) -> None:
        async with httpx.AsyncClient() as http:
            active = await self.s.active_router(http)
        if active is None:
            print(f"[{self.now():6.1f}] router fault skipped: no active router", flush=True)
            return
        proc = self.s.router_child(active)
        other = 1 - active
        f = self._fault("router", f"r{active} pid {proc.pid}")
        await self.s.kill(proc)
        await self.s.wait_router(other, (200,), within_s=60.0)
        self._recovered(f)
        f.detail = f"r{other} took over"
        await asyncio.sleep(self.rng.uniform(0.2, 1.0))
        await self.s.start_router(active, standby_of=self.s.router_url(other))  # waits for /ready 503

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
            "engines": len(self.s.iids),
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
    try:
        return await _timed_restart_on(stack, n, mode, timeout_s)
    finally:
        await stack.close()


async def _timed_restart_on(stack: Stack, n: int, mode: str, timeout_s: float) -> dict[str, Any]:
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
    for path in sorted(tmp.glob("journal-*.jsonl")):
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
    with tempfile.TemporaryDirectory(prefix="scale-restart.") as tmpdir:
        stack = Stack(Path(tmpdir), n, {"ttft_base_ms": 2.0, "itl_ms": 1.0, "max_concurrency": 256})
        try:
            res = asyncio.run(_timed_restart(stack, n, mode, timeout_s))
        finally:
            stack.close_now()
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
    with ctx as tmpdir:
        stack = Stack(Path(tmpdir), a.engines, sim_opts)

        async def go() -> dict[str, Any]:
            try:
                await stack.bring_up()
                print(f"stack up in {tmpdir}", flush=True)
                return await Drill(stack, a).run()
            finally:
                await stack.close()

        try:
            report = asyncio.run(go())
        finally:
            stack.close_now()  # interrupted (SIGTERM): every child by PID; no-op after close()
    print(summary_text(report))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(report, indent=2))
    return 0 if passed(report) else 1


if __name__ == "__main__":
    sys.exit(main())
