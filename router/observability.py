"""OpenTelemetry for the ``narwhal-serve`` process (``router/telemetry.py`` does the mechanics).

``install`` is called once per process, after the app is built and before it starts. When
``OTEL_EXPORTER_OTLP_ENDPOINT`` is unset it returns at once: no instrumentation package is imported,
no middleware, no client patch, no exporter thread — the hot path is exactly the untraced one.
When tracing is configured:

- every request gets a SERVER span continuing the caller's W3C context (incl.
  ``POST /narwhal/lifecycle/drain``, called by the restart activities);
- every engine call gets a CLIENT span and a ``traceparent`` header: the control-plane httpx client
  (``engines/control.py``: identity, attestation, checks) and the data-plane aiohttp sessions
  (``engines/legs.py``: prefill and decode legs, probes), so a client request's trace flows through
  both legs.

When metrics are configured the router counters (``narwhal.router.requests{outcome}``) and a few
state gauges are exported. ``shutdown`` flushes both at the end of the graceful stop.
"""

from __future__ import annotations

from aiohttp import web

from router import telemetry
from router.core import RouterCore

SERVICE_NAME = "narwhal-router"


def _gauges(core: RouterCore) -> telemetry.MetricsCallback:
    def gauges() -> dict[str, float]:
        return {
            "ready": float(core.ready()),
            "controls_fleet": float(core.controls_fleet()),
            "eligible_engines": float(len(core.scheduler.eligible())),
            "draining_engines": float(len(core.scheduler.draining)),
        }

    return gauges


TRACED_KEY: web.AppKey[bool] = web.AppKey("narwhal_traced", bool)


def traces_requests(app: web.Application) -> bool:
    """True when ``install`` put the server span middleware on ``app``: its completion requests must
    go through aiohttp (the client listener's own protocol, ``serving/front.py``, has no spans)."""
    return app.get(TRACED_KEY, False)


def install(app: web.Application, core: RouterCore) -> bool:
    """Tracing + metric export for this router process when configured; True if anything was set up."""
    traced = telemetry.setup_tracing(SERVICE_NAME) is not None
    if traced:
        app[TRACED_KEY] = True
        telemetry.instrument_aiohttp_server(app)  # before the app is frozen by AppRunner.setup()
        telemetry.instrument_aiohttp_client()  # engine sessions are created at startup, after this
        telemetry.instrument_httpx()  # control-plane client (engines/control.py)
    exported = telemetry.setup_metrics(SERVICE_NAME, core.counters.snapshot, _gauges(core)) is not None
    return traced or exported


def shutdown() -> None:
    """Flush spans/metrics still buffered (no-op when nothing was installed)."""
    telemetry.shutdown_telemetry()
