"""RouterCore: the state every router component shares, and the readiness predicates (spec §3.4).

Components (serving, breaker, lifecycle, HA) receive the core plus the other components they use
as typed constructor arguments (wired once in ``router/assemble.py``); the core holds state only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from router.builds import EngineBuilds
from router.clock import Clock, SystemClock
from router.config import FleetConfig
from router.counters import Counters
from router.engine_stats import EngineStats
from router.ha.control import ControlState
from router.ha.demand_risk import DemandRisk
from router.journal import Journal
from router.scheduler import Scheduler


@dataclass
class RouterCore:
    config: FleetConfig
    journal: Journal
    clock: Clock = field(default_factory=SystemClock)
    control: ControlState = field(default_factory=ControlState)
    scheduler: Scheduler = field(init=False)
    counters: Counters = field(default_factory=Counters)
    identities_ready: bool = True  # false until the startup/takeover identity check passes
    monitoring_degraded: str = ""  # "<stage> <Class>" while monitoring is degraded
    # why the last state write failed ("" = persisted): lifecycle changes are refused, serving goes on
    persist_degraded: str = ""
    # the smallest max_model_len the engines report (router/context_limits.py); None: not reported
    model_context: int | None = None
    started_wall: float = field(init=False)
    started_mono: float = field(init=False)
    # consolidation-risk events (spec §9.3): serving records "first_token_timeout" here
    demand_risk: DemandRisk = field(init=False)
    # per-engine, per-leg serving evidence (router/engine_stats.py): configured engines only
    engine_stats: EngineStats = field(init=False)
    # each engine's build identity as last read (/version, attestation digests; router/builds.py)
    engine_builds: EngineBuilds = field(default_factory=EngineBuilds)

    def __post_init__(self) -> None:
        ctl = self.config.controller
        self.scheduler = Scheduler.from_specs(
            self.config.engines,
            floors={"prefill": ctl.min_prefill, "decode": ctl.min_decode},
            now=self.clock.monotonic,
        )
        self.started_wall = self.clock.wall()
        self.started_mono = self.clock.monotonic()
        self.demand_risk = DemandRisk(self.clock)
        self.engine_stats = EngineStats(self.scheduler.engines)

    def max_tokens_limit(self) -> int | None:
        """The largest ``max_tokens`` a request may ask for (None: unbounded)."""
        limits = [v for v in (self.config.serving.max_tokens_limit, self.model_context) if v is not None]
        return min(limits) if limits else None

    # -- predicates (spec §3.4) -------------------------------------------------------------
    def controls_fleet(self) -> bool:
        return self.control.controls_fleet()

    def control_ready(self) -> bool:
        return self.controls_fleet() and not self.monitoring_degraded

    def ready(self) -> bool:
        if self.control.replica is not None:  # active-active: every replica that can place serves
            return not self._replica_reason() and bool(self.scheduler.eligible())
        return (
            self.control_ready()
            and self.identities_ready
            and not self.scheduler.fleet_hold
            and bool(self.scheduler.eligible())
        )

    def _replica_reason(self) -> str:
        """Active-active readiness: the replica gate, then the holds every replica follows."""
        assert self.control.replica is not None
        why = self.control.replica.placement_reason()
        if why:
            return why
        if self.scheduler.fleet_hold:
            return self.scheduler.fleet_hold
        if self.controls_fleet() and self.monitoring_degraded:
            return f"monitoring degraded: {self.monitoring_degraded}"
        if not self.identities_ready:
            return "engine identity validation pending"
        return ""

    def ready_reason(self) -> str:
        """Why /ready is 503, in the peer's precedence order; "" when ready."""
        if self.control.replica is not None:
            return self._replica_reason() or ("" if self.scheduler.eligible() else "no available engines")
        if self.control.failover_blocked:
            return self.control.failover_blocked
        if self.scheduler.fleet_hold:
            return self.scheduler.fleet_hold
        if self.monitoring_degraded:
            return f"monitoring degraded: {self.monitoring_degraded}"
        if self.control.standby:
            return "shadowing"
        if not self.controls_fleet():
            return "lease expired"
        if not self.identities_ready:
            return "engine identity validation pending"
        if not self.scheduler.eligible():
            excluded = self.scheduler.excluded
            detail = "; ".join(f"{iid} {why}" for iid, why in sorted(excluded.items()))
            return f"no available engines ({detail})" if detail else "no available engines"
        return ""

    def health_status(self) -> str:
        if self.ready():
            return "ok"
        if self.control.fenced():
            return "fenced"
        if self.scheduler.fleet_hold:
            return "maintenance"
        if self.control.standby:
            return "standby"
        return "degraded"

    def prefill_hold_reason(self) -> str:
        """Why a new prefill placement is refused right now ("" = allowed)."""
        if self.control.replica is not None:
            why = self.control.replica.placement_reason()
            if why or not (self.controls_fleet() and self.monitoring_degraded):
                return why
            return f"monitoring degraded: {self.monitoring_degraded}"
        if not self.controls_fleet():
            return self.control.failover_blocked or (
                "standby: the primary router is serving" if self.control.standby else "lease expired"
            )
        if self.monitoring_degraded:
            return f"monitoring degraded: {self.monitoring_degraded}"
        return ""
