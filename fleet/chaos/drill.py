"""The chaos drill: steady client load on an HA router pair while rolling restarts run, with
seeded kill -9 faults of the worker, the active router, an engine, or the Temporal dev server.
See ``fleet/chaos/__init__.py`` for what is measured and which invariants must hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp
import httpx

from fleet.chaos.stack import ChaosStack
from fleet.chaos.streams import RequestFailed, completion_body, new_session, pct, stream_completion

NAMESPACE = "default"
HOLD_STATES = frozenset({"draining", "drained", "deadline_exceeded", "validating", "blocked"})
FAULT_KINDS = ("worker", "router", "engine", "temporal")
# steps of an engine whose restart command may already have reached the supervisor
RESTART_UNDER_WAY = frozenset({"restarting", "waiting_for_new_process", "readmitting", "confirming"})
# which faults can cut a client stream (and so explain a failed request)
CUTS_STREAMS = frozenset({"router", "engine"})
ATTRIBUTION_GRACE_S = 2.0
RETRY_BUDGET_S = 10.0


@dataclass(frozen=True)
class DrillOptions:
    """How long and how hard the drill runs (``short()`` is the CI configuration, ≤ ~90 s)."""

    duration: float = 180.0  # seconds of faults + restarts
    tail: float = 120.0  # max extra seconds for the last restart
    engines: int = 6
    seed: int = 1
    faults: tuple[str, ...] = FAULT_KINDS
    concurrency: int = 8
    max_tokens: int = 8
    think_s: float = 0.02
    first_fault: tuple[float, float] = (2.0, 5.0)  # the first fault comes this many seconds in
    gap: tuple[float, float] = (2.0, 6.0)  # seconds between faults

    @classmethod
    def short(cls, **kw: Any) -> DrillOptions:
        base: dict[str, Any] = {
            "duration": 40.0, "tail": 35.0, "engines": 6, "concurrency": 6,
            "first_fault": (2.0, 4.0), "gap": (1.0, 3.0),
        }  # fmt: skip
        return cls(**{**base, **kw})


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


class Drill:
    def __init__(self, stack: ChaosStack, a: DrillOptions) -> None:
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

        from narwhal_models.restart import RestartResult
        from workflows.client import connect

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
        # an unfinished workflow's engine past its drain may have had its restart command carried
        # out by the supervisor before the workflow recorded it: one supervisor restart is its own
        in_flight: Counter[str] = Counter()
        for w in self.workflows:
            for iid, e in (w.get("engines") or {}).items():
                if e.get("outcome") == "restarted" or e.get("restarted_by_us"):
                    wf_restarts[iid] += 1
                elif e.get("step") in RESTART_UNDER_WAY:
                    in_flight[iid] += 1
        allowed = wf_restarts + in_flight
        duplicated = {iid: n - allowed[iid] for iid, n in sup_restarts.items() if n > allowed[iid]}
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
