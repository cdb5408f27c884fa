"""Which components a router process runs, wired together. The one place that knows them all.

``assemble`` builds the component graph once: every component receives the collaborators it uses
as typed constructor arguments (or small ``Protocol``s: ``ha.transfer.LifecycleView``,
``ha.service.MonitorView``); nothing is looked up at run time. The control mode
(``router/control_mode.py``: active-passive, or active-active from ``router/replicas/wiring.py``)
is chosen here and given to the core (readiness, placement, recovery), the lifecycle (the drain's
acknowledgement, via the core) and HA (a takeover's adoption). The result, ``Router``, names every
component; the application carries it under ``ROUTER_KEY`` (tests and in-process tools read it
there).

To add a component: build it in ``assemble`` from the parts it uses, give it a field on ``Router``
and a place in ``Router.components`` (start order; stop is reversed).
To add an option: add a field (with its default) to ``RouterOptions`` and a flag of the same name in
``router/cli.py``; ``cli.options_from_args`` copies flags to fields by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from router.app import Component, build_app
from router.breaker import Breaker
from router.clock import Clock, SystemClock
from router.config import FleetConfig
from router.context_limits import ContextLimits
from router.core import RouterCore
from router.engines.legs import EngineClient
from router.ha import settings as ha_settings
from router.ha.service import HAService
from router.journal import Journal
from router.lifecycle.monitor import LifecycleMonitor
from router.lifecycle.service import LifecycleService
from router.lifecycle.wiring import install_control_auth, lifecycle_components
from router.listeners import install_listener_split
from router.metrics import MetricsRenderer, ServingStats
from router.ops import Ops
from router.probes import Prober
from router.replicas import wiring as replica_wiring
from router.serving.handler import Serving
from router.state import StateApi


@dataclass
class RouterOptions:
    """Process options (CLI flags). Every field has a default so tests can build routers in-process."""

    host: str = "127.0.0.1"
    port: int = 8000
    journal: str | None = None
    max_concurrent: int | None = None  # in-flight seats (default serving.max_connections)
    graceful_timeout: float | None = None  # default serving.graceful_timeout_s
    log_level: str = "info"
    probe_interval: float | None = None  # recovery probe cadence (default monitor_interval × readmit_every)
    # --- lifecycle / HA options: add fields here (same name as the CLI flag) ----------------------
    # HA (router/ha/settings.py; None = fleet file ``ha`` / ``recovery`` value)
    resume: bool | None = None
    lease_path: str | None = None
    etcd_endpoints: str | None = None
    etcd_prefix: str | None = None
    etcd_cacert: str | None = None
    etcd_cert: str | None = None
    etcd_key: str | None = None
    etcd_user: str | None = None
    etcd_password_env: str | None = None
    router_id: str | None = None
    lease_ttl: float | None = None
    lease_renew_interval: float | None = None
    lease_safety_margin: float | None = None
    standby_of: str | None = None
    standby_probe_interval: float | None = None
    standby_takeover_after: int | None = None
    standby_max_handoff_age: float | None = None
    # active-active (router/replicas/settings.py; None = fleet file ``ha`` value)
    ha_mode: str | None = None
    replica_ttl: float | None = None
    replica_safety_margin: float | None = None
    advertise_url: str | None = None
    # control listener (router/listeners.py; None = fleet file ``control.host`` / ``control.port``)
    control_host: str | None = None
    control_port: int | None = None

    def validate(self) -> None:
        """Raise ValueError (CLI: exit 2) for values that cannot work; runs before anything starts."""
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise ValueError("--max-concurrent must be >= 1")
        for name in ("graceful_timeout", "probe_interval"):
            v = getattr(self, name)
            if v is not None and (not math.isfinite(v) or v < 0):
                raise ValueError(f"--{name.replace('_', '-')} must be finite and >= 0")
        ha_settings.check_options(self)  # HA: nan/inf lease and standby timings


@dataclass
class RouterParts:
    """The built-in components, for components that need to talk to them."""

    engines: EngineClient
    breaker: Breaker
    prober: Prober
    stats: ServingStats
    metrics: MetricsRenderer
    serving: Serving
    ops: Ops


def journal_path(config: FleetConfig, options: RouterOptions) -> Path:
    if options.journal:
        return Path(options.journal)
    profiles = (config.profiles or {}).get("path", "runs/profiles.json")
    return Path(str(profiles)).parent / "journal.jsonl"


def build_parts(core: RouterCore, options: RouterOptions) -> RouterParts:
    cfg = core.config
    engines = EngineClient(cfg, max_connections=options.max_concurrent)
    breaker = Breaker(
        core.scheduler,
        core.clock,
        cfg.recovery.eject_after,
        emit=core.journal.append,
        quarantine_s=cfg.recovery.failure_quarantine_s,
    )
    prober = Prober(core, breaker, engines, interval_s=options.probe_interval)
    stats = ServingStats()
    metrics = MetricsRenderer(core, stats, breaker)
    serving = Serving(core, engines, breaker, stats, prober, max_concurrent=options.max_concurrent)
    ops = Ops(core, metrics)
    return RouterParts(engines, breaker, prober, stats, metrics, serving, ops)


@dataclass
class Router:
    """The component graph of one router process (built by ``assemble``)."""

    core: RouterCore
    options: RouterOptions
    parts: RouterParts
    lifecycle: LifecycleService
    monitor: LifecycleMonitor
    ha: HAService
    context: ContextLimits
    replicas: list[Component] = field(default_factory=list)  # active-active (router/replicas), or none
    state: StateApi | None = None  # /narwhal/state + /narwhal/targets (read-only views over the rest)
    app: web.Application = field(init=False)  # built from ``components()`` by ``assemble``

    def components(self) -> list[Component]:
        p = self.parts
        return [
            p.engines,  # shared engine sessions: first to start, last to stop
            p.serving,
            p.ops,
            p.prober,
            self.context,  # max_tokens bound from the engines' max_model_len
            self.lifecycle,  # /narwhal/lifecycle (router/lifecycle)
            self.monitor,  # identity / liveness / readmission / handoff stages
            self.ha,  # lease, handoff, state file, standby (router/ha)
            *self.replicas,  # every replica serves, the lease holder controls (router/replicas)
            *([self.state] if self.state is not None else []),  # /narwhal/state, /narwhal/targets
        ]


ROUTER_KEY: web.AppKey[Router] = web.AppKey("narwhal_router", Router)


def assemble(config: FleetConfig, options: RouterOptions | None = None, clock: Clock | None = None) -> Router:
    options = options or RouterOptions()
    core = RouterCore(
        config=config, journal=Journal(journal_path(config, options)), clock=clock or SystemClock()
    )
    parts = build_parts(core, options)
    ha_runtime = ha_settings.from_options(config, options, port=options.port)
    aa_settings, endpoints = replica_wiring.settings_for(config, options, ha_runtime)
    # active-active: the replica set's picture first, the lifecycle reads it (resident work, stop gate)
    picture = replica_wiring.replica_set(core, aa_settings) if aa_settings is not None else None
    life = lifecycle_components(core, parts.breaker, parts.prober, parts.metrics, replicas=picture)
    replicas: list[Component] = []
    if aa_settings is not None and picture is not None:
        mode = replica_wiring.active_active(
            core, life.service, aa_settings, endpoints, picture, ha_runtime.etcd_security()
        )
        core.mode = mode  # the one late binding: set before anything starts, never changed
        replicas.append(mode.service)
    ha = HAService(
        core, ha_runtime, lifecycle=life.service, breaker=parts.breaker, monitor=life.monitor, mode=core.mode
    )
    life.service.persist_hooks.append(ha.persist)  # the state file follows every lifecycle change
    parts.metrics.extra_metric_sources.append(ha.metric_lines)
    state = StateApi(core, parts.breaker, life.service, life.monitor.health)
    router = Router(
        core, options, parts, life.service, life.monitor, ha, ContextLimits(core), replicas, state=state
    )
    router.app = build_app(core, router.components(), client_max_size=config.serving.max_request_bytes)
    router.app[ROUTER_KEY] = router
    install_control_auth(router.app, config)  # lifecycle: /narwhal/* bearer token (control.token_env)
    install_listener_split(router.app, config, options)  # /narwhal/* only on the control listener
    return router


def build_router(
    config: FleetConfig, options: RouterOptions | None = None, clock: Clock | None = None
) -> tuple[web.Application, RouterCore]:
    """``assemble``'s application and core (the graph is ``app[ROUTER_KEY]``)."""
    router = assemble(config, options, clock)
    return router.app, router.core
