"""RouterCore: the state every router component shares, and the readiness predicates (spec §3.4).

Components (serving, breaker, lifecycle, HA) receive the core plus the other components they use
as typed constructor arguments (wired once in ``router/assemble.py``); the core holds state only.
The readiness predicates are the control mode's (``router/control_mode.py``): active-passive or
active-active, chosen at assembly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from router.builds import EngineBuilds
from router.clock import Clock, SystemClock
from router.config import FleetConfig
from router.control_mode import ActivePassive, ControlMode
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
    # how this router takes part in control (router/control_mode.py): readiness and the placement
    # gate follow it. Set once by ``router/assemble.py`` before anything starts (active-active's
    # mode is built from the lifecycle, which is built from this core); never changed afterwards.
    mode: ControlMode = field(default_factory=ActivePassive)
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
        return self.mode.ready(self)

    def ready_reason(self) -> str:
        """Why /ready is 503, in the peer's precedence order; "" when ready."""
        return self.mode.ready_reason(self)

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
        return self.mode.prefill_hold_reason(self)
