"""router.telemetry: W3C context crosses httpx/aiohttp hops; nothing is installed without an endpoint."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from router import telemetry

REPO = Path(__file__).resolve().parents[2]
Traced = tuple[TestServer, list[str], TracerProvider, InMemorySpanExporter]


def _server_app(provider: TracerProvider, seen: list[str]) -> web.Application:
    async def stats(request: web.Request) -> web.Response:
        seen.append(request.headers.get("traceparent", ""))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/engines/{eid}/stats", stats)
    telemetry.instrument_aiohttp_server(app, tracer_provider=provider)
    return app


@pytest.fixture
async def traced_server() -> AsyncIterator[Traced]:
    provider, exporter = telemetry.in_memory_tracer_provider()
    seen: list[str] = []
    server = TestServer(_server_app(provider, seen))
    await server.start_server()
    try:
        yield server, seen, provider, exporter
    finally:
        await server.close()


def _one(spans: list[ReadableSpan], kind: SpanKind) -> ReadableSpan:
    matching = [s for s in spans if s.kind == kind]
    assert len(matching) == 1, [(s.name, s.kind) for s in spans]
    return matching[0]


def _assert_server_child_of_client(spans: list[ReadableSpan], traceparent: str) -> None:
    client = _one(spans, SpanKind.CLIENT)
    server = _one(spans, SpanKind.SERVER)
    root = next(s for s in spans if s.name == "operator")
    client_ctx, server_ctx = client.get_span_context(), server.get_span_context()
    assert client_ctx is not None and server_ctx is not None
    assert server_ctx.trace_id == client_ctx.trace_id == root.context.trace_id
    assert server.parent is not None and server.parent.span_id == client_ctx.span_id
    assert server.parent.is_remote
    assert client.parent is not None and client.parent.span_id == root.context.span_id
    version, trace_id, parent_id, flags = traceparent.split("-")
    assert (version, trace_id, parent_id) == (
        "00",
        f"{client_ctx.trace_id:032x}",
        f"{client_ctx.span_id:016x}",
    )
    assert int(flags, 16) & 0x01  # sampled
    assert server.attributes is not None
    assert server.name.endswith("/engines/{eid}/stats")


async def test_httpx_client_span_is_parent_of_aiohttp_server_span(
    traced_server: Traced,
) -> None:
    server, seen, provider, exporter = traced_server
    async with httpx.AsyncClient() as client:
        telemetry.instrument_httpx(client, tracer_provider=provider)
        tracer = provider.get_tracer("test")
        with tracer.start_as_current_span("operator"):
            resp = await client.get(str(server.make_url("/engines/e0/stats")))
    assert resp.status_code == 200
    spans = list(exporter.get_finished_spans())
    assert len(spans) == 3
    _assert_server_child_of_client(spans, seen[0])


async def test_aiohttp_client_span_is_parent_of_aiohttp_server_span(
    traced_server: Traced,
) -> None:
    server, seen, provider, exporter = traced_server
    telemetry.instrument_aiohttp_client(tracer_provider=provider)
    try:
        tracer = provider.get_tracer("test")
        async with aiohttp.ClientSession() as session:
            with tracer.start_as_current_span("operator"):
                async with session.get(server.make_url("/engines/e1/stats")) as resp:
                    assert resp.status == 200
    finally:
        AioHttpClientInstrumentor().uninstrument()
    _assert_server_child_of_client(list(exporter.get_finished_spans()), seen[0])


async def test_server_without_incoming_context_starts_a_new_root_trace(
    traced_server: Traced,
) -> None:
    server, seen, _, exporter = traced_server
    async with httpx.AsyncClient() as client:  # not instrumented: no traceparent sent
        resp = await client.get(str(server.make_url("/engines/e2/stats")))
    assert resp.status_code == 200 and seen == [""]
    (span,) = exporter.get_finished_spans()
    assert span.kind == SpanKind.SERVER and span.parent is None
    # only apps passed to instrument_aiohttp_server are traced: web.Application is not patched
    assert web.Application.__module__ == "aiohttp.web_app"


def test_temporal_interceptors_use_the_given_provider() -> None:
    from temporalio.contrib.opentelemetry import TracingInterceptor

    provider, _ = telemetry.in_memory_tracer_provider()
    (interceptor,) = telemetry.temporal_interceptors(provider)
    assert isinstance(interceptor, TracingInterceptor)
    assert interceptor.tracer.__class__.__module__.startswith("opentelemetry.sdk")


def test_metrics_export_router_counters_and_gauges() -> None:
    reader = InMemoryMetricReader()
    values = {"served": 3, "failed": 1}
    provider = telemetry.setup_metrics(
        "narwhal-router", lambda: values, lambda: {"ready": 1.0, "lease_epoch": 4.0}, reader=reader
    )
    assert provider is not None
    values["served"] = 5
    data = reader.get_metrics_data()
    assert data is not None
    points: dict[tuple[str, str], float] = {}
    for rm in data.resource_metrics:
        assert rm.resource.attributes["service.name"] == "narwhal-router"
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    key = str(next(iter(point.attributes.values())))
                    points[(metric.name, key)] = point.value
    assert points == {
        (telemetry.REQUESTS_METRIC, "served"): 5,
        (telemetry.REQUESTS_METRIC, "failed"): 1,
        (telemetry.STATE_METRIC, "lease_epoch"): 4.0,
        (telemetry.STATE_METRIC, "ready"): 1.0,
    }
    provider.shutdown()


# --- process-level behaviour: run in a child interpreter so the global providers stay pristine ---

_CHILD = textwrap.dedent(
    """
    import time
    from opentelemetry import metrics, trace
    from router import telemetry
    provider = telemetry.setup_tracing("narwhal-probe")
    meter_provider = telemetry.setup_metrics("narwhal-probe", lambda: {"served": 1})
    with trace.get_tracer("probe").start_as_current_span("probe-span"):
        pass
    if provider is not None:
        provider.force_flush()
    print("provider", type(provider).__name__, type(trace.get_tracer_provider()).__name__)
    print("meter", type(meter_provider).__name__, type(metrics.get_meter_provider()).__name__)
    """
)


def _run_child(env_overrides: dict[str, str]) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(env_overrides)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


class _Collector:
    def __init__(self) -> None:
        self.requests: list[tuple[str, bytes]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, await request.read()))
        return web.Response(status=200, content_type="application/x-protobuf", body=b"")


@pytest.fixture
async def collector() -> AsyncIterator[tuple[_Collector, str]]:
    sink = _Collector()
    app = web.Application()
    app.router.add_post("/v1/{signal}", sink.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield sink, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def test_without_endpoint_nothing_is_installed_or_exported(
    collector: tuple[_Collector, str],
) -> None:
    sink, _ = collector
    out = await _to_thread(_run_child, {})
    assert out == ["provider NoneType ProxyTracerProvider", "meter NoneType _ProxyMeterProvider"]
    assert sink.requests == []


async def test_with_endpoint_spans_reach_the_otlp_collector(collector: tuple[_Collector, str]) -> None:
    sink, url = collector
    out = await _to_thread(_run_child, {"OTEL_EXPORTER_OTLP_ENDPOINT": url})
    assert out == ["provider TracerProvider TracerProvider", "meter MeterProvider MeterProvider"]
    traces = [body for path, body in sink.requests if path == "/v1/traces"]
    assert traces, sink.requests
    request = ExportTraceServiceRequest.FromString(traces[0])
    (resource_spans,) = request.resource_spans
    attrs = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert attrs["service.name"] == "narwhal-probe"
    names = [s.name for ss in resource_spans.scope_spans for s in ss.spans]
    assert names == ["probe-span"]
    # metrics are flushed at interpreter exit by the meter provider's shutdown hook
    assert any(path == "/v1/metrics" for path, _ in sink.requests)


async def test_sdk_disabled_wins_over_endpoint(collector: tuple[_Collector, str]) -> None:
    sink, url = collector
    out = await _to_thread(_run_child, {"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_SDK_DISABLED": "true"})
    assert out[0] == "provider NoneType ProxyTracerProvider"
    assert sink.requests == []


async def _to_thread(fn: Callable[[dict[str, str]], list[str]], env: dict[str, str]) -> list[str]:
    return await asyncio.to_thread(fn, env)
