"""Which components a router process runs, wired together. The one place that knows them all.

To add a component: build it in ``build_router`` (it may use ``parts``: engines, breaker, prober,
metrics, serving, ops) and append it to the list in ``components`` (start order; stop is reversed).
To add an option: add a field (with its default) to ``RouterOptions`` and a flag of the same name in
``router/cli.py``; ``cli.options_from_args`` copies flags to fields by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from router.app import Component, build_app
from router.breaker import Breaker
from router.clock import Clock, SystemClock
from router.config import FleetConfig
from router.core import RouterCore
from router.engines.legs import EngineClient
from router.ha import settings as ha_settings
from router.ha.service import HAService
from router.journal import Journal
from router.lifecycle.wiring import install_control_auth, lifecycle_components
from router.listeners import install_listener_split
from router.metrics import MetricsRenderer, ServingStats
from router.ops import Ops
from router.probes import Prober
from router.serving.handler import Serving


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
    router_id: str | None = None
    lease_ttl: float | None = None
    lease_renew_interval: float | None = None
    lease_safety_margin: float | None = None
    standby_of: str | None = None
    standby_probe_interval: float | None = None
    standby_takeover_after: int | None = None
    standby_max_handoff_age: float | None = None
    # control listener (router/listeners.py; None = fleet file ``control.host`` / ``control.port``)
    control_host: str | None = None
    control_port: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # free-form, for experiments

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
    breaker = Breaker(core.scheduler, core.clock, cfg.recovery.eject_after, emit=core.journal.append)
    prober = Prober(core, breaker, engines, interval_s=options.probe_interval)
    stats = ServingStats()
    metrics = MetricsRenderer(core, stats, breaker)
    serving = Serving(core, engines, breaker, stats, prober, max_concurrent=options.max_concurrent)
    ops = Ops(core, metrics)
    return RouterParts(engines, breaker, prober, stats, metrics, serving, ops)


def ha_component(core: RouterCore, parts: RouterParts, options: RouterOptions) -> HAService:
    ha = HAService(core, ha_settings.from_options(core.config, options, port=options.port))
    parts.metrics.extra_metric_sources.append(ha.metric_lines)
    return ha


def build_router(
    config: FleetConfig, options: RouterOptions | None = None, clock: Clock | None = None
) -> tuple[web.Application, RouterCore]:
    options = options or RouterOptions()
    core = RouterCore(
        config=config, journal=Journal(journal_path(config, options)), clock=clock or SystemClock()
    )
    parts = build_parts(core, options)
    core.extras["parts"] = parts
    core.extras["options"] = options

    components: list[Component] = [
        parts.engines,  # shared engine sessions: first to start, last to stop
        parts.serving,
        parts.ops,
        parts.prober,
        # --- lifecycle / HA components go here, e.g. LifecycleApi(core, parts), HAComponent(core, options)
        *lifecycle_components(core, parts),  # lifecycle: API + monitor (router/lifecycle/wiring.py)
        ha_component(core, parts, options),  # HA: lease, handoff, state file, standby (router/ha)
    ]
    app = build_app(core, components, client_max_size=config.serving.max_request_bytes)
    install_control_auth(app, config)  # lifecycle: /narwhal/* bearer token (control.token_env)
    install_listener_split(app, config, options)  # /narwhal/* only on the control listener, if any
    return app, core
