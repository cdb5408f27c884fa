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
Settings: ``router/settings.py`` resolves the flags (``RouterOptions``) over the fleet file once into
a frozen ``Settings``; ``build`` takes it (``router/cli.py`` resolves it before anything starts) and
hands each component the typed part it uses. ``assemble(config, options)`` resolves and builds, for
in-process callers (tests, tools).
To add an option: add a field (with its default) to ``RouterOptions`` (``router/options.py``) and a
flag of the same name in ``router/cli.py`` (``cli.options_from_args`` copies flags to fields by
name); if components need a merged value, add it to ``Settings`` and resolve it in ``resolve``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from router.app import Component, build_app
from router.breaker import Breaker
from router.clock import Clock, SystemClock
from router.config import FleetConfig
from router.context_limits import ContextLimits
from router.core import RouterCore
from router.engines.control import EngineControl
from router.engines.legs import EngineClient
from router.ha.service import HAService
from router.journal import Journal
from router.lifecycle.monitor import LifecycleMonitor
from router.lifecycle.service import LifecycleService
from router.lifecycle.wiring import install_control_auth, lifecycle_components
from router.listeners import install_listener_split
from router.metrics import MetricsRenderer, ServingStats
from router.ops import Ops
from router.options import RouterOptions
from router.probes import Prober
from router.replicas import wiring as replica_wiring
from router.serving.handler import Serving
from router.settings import Settings, resolve
from router.state import StateApi

__all__ = ["ROUTER_KEY", "Router", "RouterOptions", "RouterParts", "assemble", "build", "build_router"]


@dataclass
class RouterParts:
    """The built-in components, for components that need to talk to them."""

    engines: EngineClient
    control: EngineControl
    breaker: Breaker
    prober: Prober
    stats: ServingStats
    metrics: MetricsRenderer
    serving: Serving
    ops: Ops


def build_parts(core: RouterCore, settings: Settings | RouterOptions) -> RouterParts:
    if isinstance(settings, RouterOptions):  # in-process callers that build only the parts
        settings = resolve(core.config, settings)
    cfg = core.config
    engines = EngineClient(cfg)
    control = EngineControl(cfg)  # the one engine-control client (prober, lifecycle, context limits)
    breaker = Breaker(
        core.scheduler,
        core.clock,
        cfg.recovery.eject_after,
        emit=core.journal.append,
        quarantine_s=cfg.recovery.failure_quarantine_s,
    )
    prober = Prober(core, breaker, engines, control, interval_s=settings.probe_interval_s)
    stats = ServingStats()
    metrics = MetricsRenderer(core, stats, breaker)
    serving = Serving(core, engines, breaker, stats, prober, max_concurrent=settings.seats)
    ops = Ops(core, metrics)
    return RouterParts(engines, control, breaker, prober, stats, metrics, serving, ops)


@dataclass
class Router:
    """The component graph of one router process (built by ``assemble``)."""

    core: RouterCore
    settings: Settings
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
            p.control,  # the engine-control client the prober, lifecycle and context limits share
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


def build(settings: Settings, clock: Clock | None = None) -> Router:
    """The component graph for resolved ``settings`` (``router/settings.py``)."""
    config = settings.fleet
    core = RouterCore(config=config, journal=Journal(settings.journal), clock=clock or SystemClock())
    parts = build_parts(core, settings)
    aa = settings.replica  # active-active settings, None in active-passive mode
    # active-active: the replica set's picture first, the lifecycle reads it (resident work, stop gate)
    picture = replica_wiring.replica_set(core, aa) if aa is not None else None
    life = lifecycle_components(
        core, parts.breaker, parts.prober, parts.metrics, parts.control, replicas=picture
    )
    replicas: list[Component] = []
    if aa is not None and picture is not None:
        mode = replica_wiring.active_active(
            core, life.service, aa, settings.etcd_endpoints, picture, settings.ha.etcd_security()
        )
        core.mode = mode  # the one late binding: set before anything starts, never changed
        replicas.append(mode.service)
    ha = HAService(
        core, settings.ha, lifecycle=life.service, breaker=parts.breaker, monitor=life.monitor, mode=core.mode
    )
    life.service.persist_hooks.append(ha.persist)  # the state file follows every lifecycle change
    parts.metrics.extra_metric_sources.append(ha.metric_lines)
    state = StateApi(core, parts.breaker, life.service, life.monitor.health)
    router = Router(
        core,
        settings,
        parts,
        life.service,
        life.monitor,
        ha,
        ContextLimits(core, parts.control),
        replicas,
        state=state,
    )
    router.app = build_app(core, router.components(), client_max_size=config.serving.max_request_bytes)
    router.app[ROUTER_KEY] = router
    install_control_auth(router.app, config)  # lifecycle: /narwhal/* bearer token (control.token_env)
    install_listener_split(router.app, config, settings.options)  # /narwhal/* only on the control listener
    return router


def assemble(config: FleetConfig, options: RouterOptions | None = None, clock: Clock | None = None) -> Router:
    """Resolve ``options`` over ``config`` (``ValueError``/``ConfigError``) and build the graph."""
    return build(resolve(config, options), clock)


def build_router(
    config: FleetConfig, options: RouterOptions | None = None, clock: Clock | None = None
) -> tuple[web.Application, RouterCore]:
    """``assemble``'s application and core (the graph is ``app[ROUTER_KEY]``)."""
    router = assemble(config, options, clock)
    return router.app, router.core
