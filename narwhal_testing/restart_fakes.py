"""Fake restart activities (same names as the real ones) over an in-memory fleet: the workflow unit
tests and the history recorder (scripts/record_histories.py) run the real workflows against them."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from narwhal_models.evidence import Buckets, EngineCounters, EvidenceSnapshot, LegCounters, RouterEvidence
from narwhal_models.restart import (
    ConfirmRequest,
    DrainOutcome,
    DrainRequest,
    EngineTarget,
    EngineView,
    FleetView,
    LaunchReport,
    LockOwner,
    LockOwnerRequest,
    NewProcess,
    PreflightOutcome,
    PreflightRequest,
    ProcessProbe,
    ReadmitOutcome,
    ReadmitRequest,
    RestartOutcome,
    RollbackRequest,
    RouterRef,
    StartEngineRequest,
    StopWait,
    StopWaitRequest,
    fleet_lock_id,
)


@dataclass
class FakeEngine:
    role: str
    state: str = "active"
    accepts_new: bool = True
    start: float = 1000.0
    old: float | None = None
    new: float | None = None
    error: str = ""
    restarts: int = 0


@dataclass
class FakeFleet:
    engines: dict[str, FakeEngine]
    calls: list[str] = field(default_factory=list)
    deadline_exceeded: set[str] = field(default_factory=set)  # wait_ready_to_stop reports the deadline
    stuck: set[str] = field(default_factory=set)  # never ready_to_stop on its own
    fail_readmit: set[str] = field(default_factory=set)
    capture_fail_once: set[str] = field(default_factory=set)
    never_back: set[str] = field(default_factory=set)  # restarted, but no newer process ever serves
    readmit_gate: asyncio.Event | None = None
    readmit_entered: asyncio.Event = field(default_factory=asyncio.Event)
    # the first read_fleet after the call ``read_gate_after`` (e.g. "readmit e0") waits for the gate
    read_gate: asyncio.Event | None = None
    read_gate_after: str = ""
    read_entered: asyncio.Event = field(default_factory=asyncio.Event)
    wave_id: str = ""
    lose_launch: dict[str, str] = field(default_factory=dict)  # iid -> "before" | "after" (one attempt)
    launched_commands: list[str] = field(default_factory=list)  # every launch the fake performed
    # the fleet lock's identity (unique per fake fleet: tests on one server do not share a lock)
    identity: str = field(default_factory=lambda: uuid.uuid4().hex[:20])
    preflight_error: str = ""  # the worker's preflight fails with this line
    pins: dict[str, bool] = field(default_factory=dict)  # /narwhal/state pins (empty: not served)
    floors: dict[str, int] = field(default_factory=dict)  # /narwhal/state floors (empty: not served)
    # canary analysis (sample_evidence): each sample every engine served 50 more prefill legs,
    # ``failing`` engines failed 20 more, ``quiet`` ones served none
    samples: int = 0
    failing: set[str] = field(default_factory=set)
    quiet: set[str] = field(default_factory=set)
    # rollback_engine: restarts the engine on its previous build (it stops failing) unless listed here
    rollback_fails: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, roles: list[str]) -> FakeFleet:
        return cls({f"e{i}": FakeEngine(role=r, start=1000.0 + i) for i, r in enumerate(roles)})

    def view(self, iid: str) -> EngineView:
        e = self.engines[iid]
        return EngineView(
            state=e.state, accepts_new=e.accepts_new, draining=e.state != "active",
            ready_to_stop=e.state == "drained", old_process_start=e.old, new_process_start=e.new,
            restart_required=True, wave_id=self.wave_id, error=e.error,
            checks=["health", "model"] if e.state == "active" and e.new else [],
        )  # fmt: skip

    def fleet_view(self) -> FleetView:
        return FleetView(
            router_url="http://fake", controls_fleet=True, ready=True, wave_id=self.wave_id,
            wave_active=bool(self.wave_id), engines={i: self.view(i) for i in self.engines},
            roles={i: e.role for i, e in self.engines.items()}, model="m", pins=dict(self.pins),
            floors=dict(self.floors),
        )  # fmt: skip

    # -- activities ----------------------------------------------------------------------------

    def activities(self) -> list[Callable[..., Any]]:
        @activity.defn(name="read_fleet")
        async def read_fleet(ref: RouterRef) -> FleetView:
            gate = self.read_gate
            if gate is not None and self.read_gate_after in self.calls and not self.read_entered.is_set():
                self.read_entered.set()
                await gate.wait()
            return self.fleet_view()

        @activity.defn(name="preflight")
        async def preflight(req: PreflightRequest) -> PreflightOutcome:
            self.calls.append("preflight")
            if self.preflight_error:
                raise ApplicationError(self.preflight_error, type="PreflightFailed", non_retryable=True)
            return PreflightOutcome(
                view=self.fleet_view(), identity=self.identity, lock_id=fleet_lock_id(self.identity)
            )

        @activity.defn(name="fleet_lock_owner")
        async def fleet_lock_owner(req: LockOwnerRequest) -> LockOwner:
            desc = await activity.client().get_workflow_handle(req.lock_id).describe()
            return LockOwner(
                lock_id=req.lock_id, owner=desc.parent_id or "",
                message=f"refused: fleet {req.fleet} is already being restarted by {desc.parent_id}",
            )  # fmt: skip

        @activity.defn(name="drain")
        async def drain(req: DrainRequest) -> DrainOutcome:
            self.calls.append(f"drain {','.join(req.engines)}" + (" wave" if req.wave else ""))
            if req.wave:
                self.wave_id = "wave-fake"
            failures = {}
            for iid in req.engines:
                e = self.engines[iid]
                e.state, e.accepts_new = "draining", False
                if iid in self.capture_fail_once:
                    self.capture_fail_once.discard(iid)
                    e.state, e.error = "blocked", "process identity unreadable: ConnectError"
                    failures[iid] = e.error
                    continue
                e.old, e.error = e.start, ""
            return DrainOutcome(
                engines={i: self.view(i) for i in req.engines},
                wave_id=self.wave_id,
                capture_failures=failures,
            )

        @activity.defn(name="wait_ready_to_stop")
        async def wait_ready_to_stop(req: StopWaitRequest) -> StopWait:
            self.calls.append(f"wait_stop {','.join(req.engines)} stop_on_deadline={req.stop_on_deadline}")
            late = [i for i in req.engines if i in self.deadline_exceeded]
            if late and req.stop_on_deadline:
                for i in late:
                    self.engines[i].state = "deadline_exceeded"
                return StopWait(status="deadline_exceeded", message="1 resident request(s) remain")
            while any(i in self.stuck for i in req.engines):
                activity.heartbeat()
                await asyncio.sleep(0.05)
            for i in req.engines:
                self.engines[i].state = "drained"
            return StopWait(status="ready_to_stop", engines={i: self.view(i) for i in req.engines})

        @activity.defn(name="start_engine")
        async def start_engine(req: StartEngineRequest) -> str:
            self.calls.append(f"start {req.iid}")
            return "started"

        @activity.defn(name="probe_process")
        async def probe_process(t: EngineTarget) -> ProcessProbe:
            self.calls.append(f"probe {t.iid}")
            if self.lose_launch.get(t.iid) == "external":  # someone else restarted it meanwhile
                del self.lose_launch[t.iid]
                self.engines[t.iid].start += 100.0
            return ProcessProbe(iid=t.iid, process_start=self.engines[t.iid].start)

        @activity.defn(name="restart_engine")
        async def restart_engine(t: EngineTarget) -> RestartOutcome:
            self.calls.append(f"restart {t.iid}")
            e = self.engines[t.iid]
            lost = self.lose_launch.pop(t.iid, "")
            if lost == "before":  # the attempt dies before it reported (and so before it launched)
                raise ApplicationError("worker lost", type="WorkerLost")
            if t.launch > 0:
                info = activity.info()
                report = LaunchReport(iid=t.iid, launch=t.launch, at=1.0)
                await (
                    activity.client()
                    .get_workflow_handle(info.workflow_id or "")
                    .signal("launch_started", report)
                )
            if lost == "after":  # launched, then the attempt is lost before it completes
                self.launched_commands.append(t.iid)
                e.start += 100.0
                e.restarts += 1
                raise ApplicationError("worker lost", type="WorkerLost")
            self.launched_commands.append(t.iid)
            if t.iid in self.never_back:  # e.g. the new process cannot bind its port
                return RestartOutcome(iid=t.iid, restarted=True)
            if e.start == t.old_process_start:
                e.start += 100.0
                e.restarts += 1
                return RestartOutcome(iid=t.iid, restarted=True, new_process_start=e.start)
            return RestartOutcome(iid=t.iid, restarted=False)

        @activity.defn(name="wait_new_process")
        async def wait_new_process(t: EngineTarget) -> NewProcess:
            e = self.engines[t.iid]
            if e.start <= t.old_process_start:
                raise ApplicationError("old process", type="NotReadyYet")
            return NewProcess(iid=t.iid, process_start=e.start)

        @activity.defn(name="readmit")
        async def readmit(req: ReadmitRequest) -> ReadmitOutcome:
            self.calls.append(f"readmit {','.join(req.engines)}")
            self.readmit_entered.set()
            if self.readmit_gate is not None:
                await self.readmit_gate.wait()
            bad = [i for i in req.engines if i in self.fail_readmit]
            if bad:
                for i in req.engines:
                    self.engines[i].state = "blocked"
                    self.engines[i].error = (
                        "serves [wrong], expected m" if i in bad else "another engine failed"
                    )
                details = {
                    i: {"state": "blocked", "error": self.engines[i].error, "checks": ["health"]}
                    for i in req.engines
                }
                raise ApplicationError(
                    "readmission validation failed",
                    {"engines": details},
                    type="ValidationFailed",
                    non_retryable=True,
                )
            for i in req.engines:
                e = self.engines[i]
                e.state, e.accepts_new, e.new, e.error = "active", True, e.start, ""
            self.wave_id = ""
            return ReadmitOutcome(engines={i: self.view(i) for i in req.engines})

        @activity.defn(name="confirm_active")
        async def confirm_active(req: ConfirmRequest) -> FleetView:
            self.calls.append(f"confirm {','.join(req.engines)} ready={req.require_ready}")
            return self.fleet_view()

        @activity.defn(name="rollback_engine")
        async def rollback_engine(req: RollbackRequest) -> str:
            self.calls.append(f"rollback {req.iid} {req.template}")
            if req.iid in self.rollback_fails:
                raise ApplicationError(
                    f"'{req.template}: rollback {req.iid}' exited 1: no previous build",
                    type="RestartCommandFailed",
                    non_retryable=True,
                )
            e = self.engines[req.iid]
            e.start += 100.0
            e.restarts += 1
            self.failing.discard(req.iid)
            return f"{req.template}: rollback {req.iid}"

        @activity.defn(name="sample_evidence")
        async def sample_evidence(ref: RouterRef) -> EvidenceSnapshot:
            self.samples += 1
            n = self.samples
            self.calls.append(f"sample {n}")
            engines = {}
            for iid in self.engines:
                served = 0 if iid in self.quiet else 50 * n
                engines[iid] = EngineCounters(
                    prefill=LegCounters(
                        served=served,
                        failed={"engine_error": 20 * n} if iid in self.failing else {},
                        ttft=Buckets(bounds=[0.01, 0.1], counts=[0, served, 0]),
                    )
                )
            return EvidenceSnapshot(
                at=float(n), routers={"http://fake": RouterEvidence(run="r", engines=engines)}
            )

        return [
            sample_evidence,
            read_fleet,
            preflight,
            fleet_lock_owner,
            drain,
            wait_ready_to_stop,
            start_engine,
            probe_process,
            restart_engine,
            wait_new_process,
            readmit,
            confirm_active,
            rollback_engine,
        ]
