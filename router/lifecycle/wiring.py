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

from router.breaker import Breaker
from router.config import FleetConfig
from router.core import RouterCore
from router.lifecycle.auth import control_auth_middleware
from router.lifecycle.models import LIFECYCLE_STATES
from router.lifecycle.monitor import LifecycleMonitor
from router.lifecycle.service import LifecycleService
from router.metrics import MetricsRenderer
from router.probes import Prober


def metric_lines(service: LifecycleService) -> Iterable[str]:
    machine, sched = service.machine, service.core.scheduler
    machine.refresh()
    out = [
        "# HELP narwhal_engine_draining Engine held out of placement by the lifecycle (1) or not (0)",
        "# TYPE narwhal_engine_draining gauge",
    ]
    out += [f'narwhal_engine_draining{{iid="{i}"}} {int(i in sched.draining)}' for i in sorted(sched.engines)]
    out += [
        "# HELP narwhal_engine_ready_to_stop Engine drained with its identity recorded: safe to stop",
        "# TYPE narwhal_engine_ready_to_stop gauge",
    ]
    out += [
        f'narwhal_engine_ready_to_stop{{iid="{i}"}} {int(machine.ready_to_stop(i))}'
        for i in sorted(sched.engines)
    ]
    out += [
        "# HELP narwhal_engine_lifecycle_state Engine lifecycle state (1 for the current state)",
        "# TYPE narwhal_engine_lifecycle_state gauge",
    ]
    for iid in sorted(sched.engines):
        current = machine.state(iid)
        out += [
            f'narwhal_engine_lifecycle_state{{iid="{iid}",state="{s}"}} {int(s == current)}'
            for s in LIFECYCLE_STATES
        ]
    return out


@dataclass(frozen=True)
class LifecycleParts:
    service: LifecycleService  # /narwhal/lifecycle routes; HA's LifecycleView
    monitor: LifecycleMonitor  # background passes; HA's MonitorView


def lifecycle_components(
    core: RouterCore, breaker: Breaker, prober: Prober, metrics: MetricsRenderer
) -> LifecycleParts:
    """The lifecycle API and monitor, with readmission hooked into the breaker and the prober."""
    service = LifecycleService(core, eject=breaker.eject)
    service.machine.readmit_hook = lambda iid: breaker.readmit(iid, "lifecycle")
    monitor = LifecycleMonitor(core, service, eject=breaker.eject, prober=prober)
    metrics.extra_metric_sources.append(lambda: metric_lines(service))
    return LifecycleParts(service, monitor)


def install_control_auth(app: web.Application, config: FleetConfig) -> None:
    middleware = control_auth_middleware(config.control)
    if middleware is not None:
        app.middlewares.append(middleware)  # type: ignore[arg-type]
