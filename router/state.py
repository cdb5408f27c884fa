"""``GET /narwhal/state`` (``narwhal.state`` v1) and ``GET /narwhal/targets``: read-only views.

The state document is the full scheduler picture in one read: readiness, the outcome counters,
every engine's placement state (ejected / held / draining / quarantined / excluded, resident work),
role floors, breaker tallies, ``ha`` (epoch, holder, standby/fenced, ``blocked``), the embedded
``narwhal.lifecycle`` v1 document, monitoring health and the consolidation-risk evidence (spec §1,
§3.2, §3.4, §8, §9.3). Built per request from live state; the pydantic models pin the shape and
``docs/schemas/narwhal.state.v1.json`` is generated from them (``python -m router.state``).
Both routes live under ``/narwhal/``, so they are served on the control listener only and follow
``control.protect_reads``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Literal

import orjson
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from router.breaker import Breaker
from router.config import Role
from router.core import RouterCore
from router.engine_stats import EngineEvidence
from router.ha.demand_risk import DemandRiskDoc
from router.lifecycle.document import LifecycleDocument, Resident
from router.lifecycle.monitor import MonitorHealth
from router.lifecycle.service import LifecycleService
from router.targets import targets_json

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "docs" / "schemas" / "narwhal.state.v1.json"
_JSON = "application/json"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RouterStatus(_Strict):
    ready: bool = Field(description="`/ready` answers 200")
    reason: str = Field(description="why `/ready` is 503 (`/ready.reason`); empty when ready")
    health: str = Field(description="`/health.status`: ok, fenced, maintenance, standby, degraded")
    controls_fleet: bool
    control_ready: bool
    identities_ready: bool = Field(description="startup/takeover identity + model check finished")


class QuarantineView(_Strict):
    until: float = Field(description="wall-clock end of the timed hold")
    remaining_s: float = Field(ge=0)
    cause: str = Field(description="failure class that started (or last extended) it")


class EngineState(_Strict):
    url: str
    attestation_url: str
    role: Role = Field(description="current router-side role")
    pin: bool
    accepts_new: bool = Field(description="placement-eligible now")
    resident: Resident
    ejected: str = Field(description="ejection cause, empty when not ejected")
    held: str = Field(description="breaker hold reason (inference suspect), empty when none")
    draining: bool = Field(description="held out by the lifecycle")
    quarantine: QuarantineView | None = Field(description="timed hold after a leg failure")
    excluded: str = Field(description="why the engine cannot serve (e.g. model not listed), or empty")
    inference_sources: list[str] | None = Field(description="producers of failed transfers (suspects)")


class Floors(_Strict):
    prefill: int = Field(ge=0)
    decode: int = Field(ge=0)


class SchedulerView(_Strict):
    fleet_hold: str = Field(description="router-wide lifecycle hold reason, empty when none")
    eligible: list[str] = Field(description="placement-eligible engines")
    floors: Floors = Field(description="controller.min_prefill / min_decode")
    engines: dict[str, EngineState]


class BreakerView(_Strict):
    ejections: dict[str, dict[str, int]] = Field(description="engine → cause → ejections")
    readmissions: dict[str, int]
    spared: dict[str, dict[str, int]] = Field(description="engine → cause → ejections the floor refused")
    quarantines: dict[str, int] = Field(description="engine → failure quarantines started")


class HAView(_Strict):
    epoch: int = Field(ge=0)
    holder: str
    lease: bool = Field(description="a lease is configured")
    controls_fleet: bool
    standby: bool
    fenced: bool
    blocked: str = Field(description="failover_blocked: why this router is fenced, or empty")


class MonitoringView(_Strict):
    degraded: str = Field(description="`<stage> <Class>` while monitoring is degraded, else empty")
    failing_passes: int = Field(ge=0)
    last_failures: list[str]
    interval_s: float


class DemandEvidence(_Strict):
    risk_kind: str
    risk_age_s: float | None
    risk_events: dict[str, int]


class StateDocument(_Strict):
    schema_: Literal["narwhal.state"] = Field(default="narwhal.state", alias="schema")
    schema_version: Literal[1] = 1
    at: float = Field(description="wall clock when the document was built")
    run: str = Field(description="journal run ID of this router process")
    model: str
    router: RouterStatus
    counters: dict[str, int] = Field(description="the handoff counters (spec §8)")
    outcome_reasons: dict[str, dict[str, int]]
    scheduler: SchedulerView
    breaker: BreakerView | None
    ha: HAView
    lifecycle: LifecycleDocument | None = Field(description="the narwhal.lifecycle v1 document")
    monitoring: MonitoringView
    demand_risk: DemandRiskDoc | None
    demand_evidence: DemandEvidence
    engine_evidence: dict[str, EngineEvidence] = Field(
        default_factory=dict,
        description="per configured engine and leg: cumulative legs served, failed by reason, "
        "TTFT and TPOT histograms of this router process (router/engine_stats.py)",
    )

    model_config = ConfigDict(extra="forbid", populate_by_name=True, title="narwhal.state v1")

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


def _by_engine(tally: dict[tuple[str, str], int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (iid, cause), n in sorted(tally.items()):
        if n:
            out.setdefault(iid, {})[cause] = n
    return out


def engine_state(core: RouterCore, iid: str) -> EngineState:
    sched, clock = core.scheduler, core.clock
    e = sched.engines[iid]
    accepts = sched.accepts_new(iid)  # expires finished quarantines first
    q = sched.quarantined.get(iid)
    quarantine = None
    if q is not None:
        left = max(0.0, q.until - clock.monotonic())
        quarantine = QuarantineView(until=clock.wall() + left, remaining_s=left, cause=q.cause)
    sources = sched.inference_suspects.get(iid)
    return EngineState(
        url=e.url,
        attestation_url=e.attestation_url,
        role=e.role,
        pin=e.pin,
        accepts_new=accepts,
        resident=Resident(prefill=e.resident_prefill, decode=e.resident_decode),
        ejected=sched.ejected.get(iid, ""),
        held=sched.held.get(iid, ""),
        draining=iid in sched.draining,
        quarantine=quarantine,
        excluded=sched.excluded.get(iid, ""),
        inference_sources=None if sources is None else sorted(sources) or [""],
    )


def build_state(
    core: RouterCore,
    breaker: Breaker | None = None,
    lifecycle: LifecycleService | None = None,
    monitor: MonitorHealth | None = None,
) -> StateDocument:
    sched, control = core.scheduler, core.control
    lifecycle_doc = lifecycle.document() if lifecycle is not None else None
    ready = core.ready()
    risk = core.demand_risk.snapshot()
    breaker_view = None
    if breaker is not None:
        breaker_view = BreakerView(
            ejections=_by_engine(breaker.ejections),
            readmissions={i: n for i, n in sorted(breaker.readmissions.items()) if n},
            spared=_by_engine(breaker.spared),
            quarantines={i: n for i, n in sorted(breaker.quarantines.items()) if n},
        )
    return StateDocument(
        at=core.clock.wall(),
        run=core.journal.run_id,
        model=core.config.model,
        router=RouterStatus(
            ready=ready,
            reason="" if ready else core.ready_reason(),
            health=core.health_status(),
            controls_fleet=core.controls_fleet(),
            control_ready=core.control_ready(),
            identities_ready=core.identities_ready,
        ),
        counters=core.counters.snapshot(),
        outcome_reasons=core.counters.outcome_reasons(),
        scheduler=SchedulerView(
            fleet_hold=sched.fleet_hold,
            eligible=[e.iid for e in sched.eligible()],
            floors=Floors(prefill=sched.floors.get("prefill", 0), decode=sched.floors.get("decode", 0)),
            engines={iid: engine_state(core, iid) for iid in sorted(sched.engines)},
        ),
        breaker=breaker_view,
        ha=HAView(
            epoch=control.epoch,
            holder=control.holder,
            lease=control.lease is not None,
            controls_fleet=core.controls_fleet(),
            standby=control.standby,
            fenced=control.fenced(),
            blocked=control.failover_blocked,
        ),
        lifecycle=lifecycle_doc,
        monitoring=MonitoringView(
            degraded=core.monitoring_degraded,
            failing_passes=monitor.failing_passes if monitor is not None else 0,
            last_failures=list(monitor.last_failures) if monitor is not None else [],
            interval_s=core.config.controller.monitor_interval_s,
        ),
        demand_risk=risk,
        demand_evidence=DemandEvidence(
            risk_kind=core.demand_risk.kind,
            risk_age_s=core.demand_risk.age_s(),
            risk_events={k: n for k, n in sorted(core.demand_risk.counts.items()) if n},
        ),
        engine_evidence=core.engine_stats.snapshot(),
    )


class StateApi:
    """Component serving ``/narwhal/state`` and ``/narwhal/targets`` (no background work)."""

    def __init__(
        self,
        core: RouterCore,
        breaker: Breaker | None = None,
        lifecycle: LifecycleService | None = None,
        monitor: MonitorHealth | None = None,
    ) -> None:
        self.core = core
        self.breaker = breaker
        self.lifecycle = lifecycle
        self.monitor = monitor

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/narwhal/state", self.state)
        app.router.add_get("/narwhal/targets", self.targets)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def document(self) -> StateDocument:
        return build_state(self.core, self.breaker, self.lifecycle, self.monitor)

    async def state(self, _: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(self.document().to_json()), content_type=_JSON)

    async def targets(self, _: web.Request) -> web.Response:
        return web.Response(body=targets_json(self.core.scheduler.engines.values()), content_type=_JSON)


def document_schema() -> dict[str, Any]:
    schema = StateDocument.model_json_schema(by_alias=True, mode="serialization")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "narwhal.state.v1.json"
    return schema


def schema_text() -> str:
    return json.dumps(document_schema(), indent=2, sort_keys=True) + "\n"


def write_schema() -> None:
    SCHEMA_PATH.write_text(schema_text(), encoding="utf-8")
    sys.stdout.write(f"wrote {SCHEMA_PATH}\n")


if __name__ == "__main__":  # regenerate the pinned schema (model names must stay unique)
    from router import state

    state.write_schema()
