"""How the lifecycle plugs into a router process (used by ``router/assemble.py``).

``lifecycle_components`` builds the lifecycle API (``LifecycleService``: routes, and the object HA
is given as its lifecycle) and the background monitor, hooks readmission into the breaker and the
prober, and adds the lifecycle gauges to ``/metrics``.
``install_control_auth`` adds the ``/narwhal/*`` bearer-token middleware when configured.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client.core import GaugeMetricFamily, Metric

from router.breaker import Breaker
from router.config import FleetConfig
from router.core import RouterCore
from router.engines.control import EngineControl
from router.lifecycle.auth import control_auth_middleware
from router.lifecycle.models import LIFECYCLE_STATES
from router.lifecycle.monitor import LifecycleMonitor
from router.lifecycle.service import LifecycleService
from router.metrics import MetricsRenderer, labelled
from router.probes import Prober
from router.replicas.view import ReplicaPicture


def metric_families(service: LifecycleService) -> Iterable[Metric]:
    machine, sched = service.machine, service.core.scheduler
    machine.refresh()
    ids = sorted(sched.engines)
    yield labelled(
        GaugeMetricFamily,
        "narwhal_engine_draining",
        "Engine held out of placement by the lifecycle (1) or not (0)",
        ["iid"],
        [([i], int(i in sched.draining)) for i in ids],
    )
    yield labelled(
        GaugeMetricFamily,
        "narwhal_engine_ready_to_stop",
        "Engine drained with its identity recorded: safe to stop",
        ["iid"],
        [([i], int(machine.ready_to_stop(i))) for i in ids],
    )
    yield labelled(
        GaugeMetricFamily,
        "narwhal_engine_lifecycle_state",
        "Engine lifecycle state (1 for the current state)",
        ["iid", "state"],
        [([i, s], int(s == machine.state(i))) for i in ids for s in LIFECYCLE_STATES],
    )


@dataclass(frozen=True)
class LifecycleParts:
    service: LifecycleService  # /narwhal/lifecycle routes; HA's LifecycleView
    monitor: LifecycleMonitor  # background passes; HA's MonitorView


def lifecycle_components(
    core: RouterCore,
    breaker: Breaker,
    prober: Prober,
    metrics: MetricsRenderer,
    control: EngineControl | None = None,
    replicas: ReplicaPicture | None = None,
) -> LifecycleParts:
    """The lifecycle API and monitor, with readmission hooked into the breaker and the prober;
    ``control``: the router's engine-control client (None: the service makes and owns its own);
    ``replicas``: active-active's replica set, for resident work and ``ready_to_stop``."""
    service = LifecycleService(core, control=control, eject=breaker.eject, replicas=replicas)
    service.machine.readmit_hook = lambda iid: breaker.readmit(iid, "lifecycle")
    monitor = LifecycleMonitor(core, service, eject=breaker.eject, prober=prober)
    metrics.extra_metric_sources.append(lambda: metric_families(service))
    return LifecycleParts(service, monitor)


def install_control_auth(app: web.Application, config: FleetConfig) -> None:
    middleware = control_auth_middleware(config.control)
    if middleware is not None:
        app.middlewares.append(middleware)  # type: ignore[arg-type]
