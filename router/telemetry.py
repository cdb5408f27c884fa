"""OpenTelemetry wiring shared by the router, the Temporal worker and the CLI.

Export is opt-in: traces/metrics leave the process over OTLP/HTTP only when
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the signal-specific ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``) is set. Without it nothing is installed: no provider, no
exporter, no background thread, nothing to flush (an exporter pointed at a missing collector blocks
``force_flush`` for seconds at exit). ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``
/ ``OTEL_METRICS_EXPORTER=none`` switch a signal off even when an endpoint is set.

Instrumentation helpers inject/extract W3C trace context (``traceparent``) on every hop: httpx and
aiohttp clients inject it, the aiohttp server middleware continues it, and the Temporal
``TracingInterceptor`` carries it through workflow and activity headers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

import httpx
from aiohttp import web

# OpenTelemetry is imported where it is used: a process that exports nothing (no endpoint set, the
# usual case) never loads it (≈0.4 s of CPU at every start of a router or CLI). The Temporal client
# is the [worker] extra; the router never imports it.
if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from temporalio.client import Interceptor

log = logging.getLogger("narwhal.telemetry")

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
METRICS_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
INSTRUMENTATION_NAME = "narwhal"
REQUESTS_METRIC = "narwhal.router.requests"
STATE_METRIC = "narwhal.router.state"

_tracer_provider: TracerProvider | None = None
_meter_provider: MeterProvider | None = None
_server_middleware_ready = False

MetricsCallback = Callable[[], Mapping[str, float]]


class OtelExtraMissing(RuntimeError):
    """OTLP export is configured but the ``[otel]`` extra (exporter, instrumentation) is not installed."""

    def __init__(self, exc: ImportError) -> None:
        super().__init__(
            f"OpenTelemetry export is configured ({ENDPOINT_ENV}) but {exc.name or exc} is not "
            "installed: install the package with its [otel] extra (pip install 'narwhal-restart[otel]')"
        )


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


def _signal_enabled(specific_endpoint_env: str, exporter_env: str) -> bool:
    if _env("OTEL_SDK_DISABLED").lower() == "true":
        return False
    if _env(exporter_env).lower() == "none":
        return False
    return bool(_env(ENDPOINT_ENV) or _env(specific_endpoint_env))


def tracing_enabled() -> bool:
    """True when traces would be exported (an OTLP endpoint is configured and not disabled)."""
    return _signal_enabled(TRACES_ENDPOINT_ENV, "OTEL_TRACES_EXPORTER")


def metrics_enabled() -> bool:
    """True when metrics would be exported (an OTLP endpoint is configured and not disabled)."""
    return _signal_enabled(METRICS_ENDPOINT_ENV, "OTEL_METRICS_EXPORTER")


def make_resource(service_name: str) -> Resource:
    """Resource with ``service.name``; ``OTEL_SERVICE_NAME`` wins when the operator set it."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    attributes = {} if _env("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    return Resource.create(attributes)


def setup_tracing(service_name: str) -> TracerProvider | None:
    """Install the global tracer provider with an OTLP/HTTP batch exporter, if an endpoint is set.

    Returns the provider (call ``shutdown()`` on it to flush at exit), or ``None`` when tracing is
    not configured, in which case nothing at all is installed. Idempotent within a process.
    """
    global _tracer_provider
    if _tracer_provider is not None:
        return _tracer_provider
    if not tracing_enabled():
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise OtelExtraMissing(exc) from None
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=make_resource(service_name))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _tracer_provider = provider
    log.info("tracing: exporting spans of %s over OTLP/HTTP", service_name)
    return provider


def tracing_installed() -> bool:
    """True once ``setup_tracing`` installed a provider in this process."""
    return _tracer_provider is not None


@contextlib.contextmanager
def client_span(method: str, url: str) -> Iterator[dict[str, str]]:
    """A CLIENT span around one engine call made without an instrumented client library; yields
    the W3C headers (``traceparent``) to send with it."""
    from opentelemetry import propagate, trace

    tracer = trace.get_tracer(INSTRUMENTATION_NAME)
    attributes = {"http.request.method": method, "http.method": method, "url.full": url, "http.url": url}
    with tracer.start_as_current_span(method, kind=trace.SpanKind.CLIENT, attributes=attributes):
        headers: dict[str, str] = {}
        propagate.inject(headers)
        yield headers


def in_memory_tracer_provider(
    service_name: str = "narwhal-test",
) -> tuple[TracerProvider, InMemorySpanExporter]:
    """For tests: a provider whose spans land synchronously in an ``InMemorySpanExporter``.

    The provider is *not* installed globally (the global can be set only once per process); pass
    it to the ``instrument_*`` helpers and to ``temporal_interceptors``.
    """
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def instrument_aiohttp_server(app: web.Application, tracer_provider: TracerProvider | None = None) -> None:
    """Add the OpenTelemetry server middleware to ``app`` (before the app is started).

    Each request gets a SERVER span that continues the caller's W3C trace context. The
    instrumentation's middleware reads module globals that only ``AioHttpServerInstrumentor
    .instrument()`` sets; we set them once and undo its global ``web.Application`` patch, so only
    the applications passed here are instrumented.
    """
    try:
        from opentelemetry.instrumentation.aiohttp_server import (
            AioHttpServerInstrumentor,
            create_aiohttp_middleware,
        )
    except ImportError as exc:
        raise OtelExtraMissing(exc) from None

    global _server_middleware_ready
    if not _server_middleware_ready:
        instrumentor = AioHttpServerInstrumentor()
        if not instrumentor.is_instrumented_by_opentelemetry:
            with warnings.catch_warnings():  # its Application subclass warns; we undo it at once
                warnings.simplefilter("ignore", DeprecationWarning)
                instrumentor.instrument()
            instrumentor.uninstrument()
        _server_middleware_ready = True
    app.middlewares.insert(0, create_aiohttp_middleware(tracer_provider=tracer_provider))


def instrument_aiohttp_client(tracer_provider: TracerProvider | None = None) -> None:
    """Trace every ``aiohttp.ClientSession`` created from now on and inject ``traceparent``."""
    try:
        from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
    except ImportError as exc:
        raise OtelExtraMissing(exc) from None

    instrumentor = AioHttpClientInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(tracer_provider=tracer_provider)


def instrument_httpx(
    client: httpx.Client | httpx.AsyncClient | None = None, tracer_provider: TracerProvider | None = None
) -> None:
    """Trace httpx requests and inject ``traceparent``: one ``client``, or every client if ``None``."""
    try:
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    except ImportError as exc:
        raise OtelExtraMissing(exc) from None

    if client is not None:
        HTTPXClientInstrumentor.instrument_client(client, tracer_provider=tracer_provider)
        return
    instrumentor = HTTPXClientInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(tracer_provider=tracer_provider)


def temporal_interceptors(tracer_provider: TracerProvider | None = None) -> list[Interceptor]:
    """Client interceptors for ``Client.connect(..., interceptors=...)``; workers inherit them.

    The ``TracingInterceptor`` creates StartWorkflow/RunWorkflow/StartActivity/RunActivity spans
    and carries the trace context in Temporal headers. With no provider installed the spans are
    non-recording, so it is safe to pass always.
    """
    from opentelemetry import trace
    from temporalio.contrib.opentelemetry import TracingInterceptor

    tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(INSTRUMENTATION_NAME)
    return [TracingInterceptor(tracer)]


def _observe(callback: MetricsCallback, attribute: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
    from opentelemetry.metrics import Observation

    def observe(_: CallbackOptions) -> Iterable[Observation]:
        try:
            values = callback()
        except Exception:  # a failing snapshot must never break the export thread
            log.exception("metrics callback failed")
            return []
        return [Observation(value, {attribute: name}) for name, value in sorted(values.items())]

    return observe


def setup_metrics(
    service_name: str,
    counters: MetricsCallback,
    gauges: MetricsCallback | None = None,
    *,
    reader: MetricReader | None = None,
    export_interval_s: float = 15.0,
) -> MeterProvider | None:
    """Export router counters (and optional gauges) as OpenTelemetry observable instruments.

    ``counters()`` returns monotonic totals keyed by outcome (e.g. ``Counters.snapshot()``), exported
    as the observable counter ``narwhal.router.requests{outcome=<key>}``; ``gauges()`` returns current
    values (ready, lease epoch, available engines…) exported as ``narwhal.router.state{name=<key>}``.

    With an OTLP endpoint configured a periodic OTLP/HTTP reader is used and the provider becomes the
    global meter provider; tests pass their own ``reader`` (not installed globally). Returns ``None``
    (nothing installed) when neither applies.
    """
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    global _meter_provider
    if reader is None:
        if _meter_provider is not None:
            return _meter_provider
        if not metrics_enabled():
            return None
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        except ImportError as exc:
            raise OtelExtraMissing(exc) from None

        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(), export_interval_millis=export_interval_s * 1000
        )
        provider = MeterProvider(resource=make_resource(service_name), metric_readers=[reader])
        metrics.set_meter_provider(provider)
        _meter_provider = provider
    else:
        provider = MeterProvider(resource=make_resource(service_name), metric_readers=[reader])
    meter = provider.get_meter(INSTRUMENTATION_NAME)
    meter.create_observable_counter(
        REQUESTS_METRIC,
        callbacks=[_observe(counters, "outcome")],
        unit="{request}",
        description="Router request counters by terminal outcome (and offered)",
    )
    if gauges is not None:
        meter.create_observable_gauge(
            STATE_METRIC,
            callbacks=[_observe(gauges, "name")],
            description="Router state gauges (readiness, lease epoch, engines)",
        )
    return provider


def shutdown_telemetry() -> None:
    """Flush and stop whatever ``setup_tracing``/``setup_metrics`` installed (no-op otherwise)."""
    global _tracer_provider, _meter_provider
    for provider in (_tracer_provider, _meter_provider):
        if provider is not None:
            try:
                provider.shutdown()
            except Exception:  # exporting at exit must never turn a clean stop into a crash
                log.exception("telemetry shutdown failed")
    _tracer_provider = _meter_provider = None
