"""One trace from a client span through Temporal (workflow → activity) → httpx → an aiohttp server.

Real Temporal dev server (packaged binary, offline), real worker, real HTTP; spans collected by an
in-memory exporter through router.telemetry's helpers.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.trace import SpanKind
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from router import telemetry
from tests.support import loopback
from tests.support.temporal import dev_server_path, dying_with_us

pytestmark = pytest.mark.integration

_PROVIDER: TracerProvider | None = None


@activity.defn
async def fetch_stats(url: str) -> str:
    async with loopback.async_client() as client:
        telemetry.instrument_httpx(client, tracer_provider=_PROVIDER)
        resp = await client.get(url)
        return str(resp.json()["traceparent"])


@workflow.defn
class TracedFetch:
    @workflow.run
    async def run(self, url: str) -> str:
        return await workflow.execute_activity(fetch_stats, url, start_to_close_timeout=timedelta(seconds=30))


def _parent_chain(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> list[str]:
    names = []
    current: ReadableSpan | None = span
    while current is not None and current.parent is not None:
        current = by_id.get(current.parent.span_id)
        if current is not None:
            names.append(current.name)
    return names


async def test_trace_spans_cli_workflow_activity_httpx_and_server(tmp_path: Path) -> None:
    global _PROVIDER
    provider, exporter = telemetry.in_memory_tracer_provider("narwhal-e2e")
    _PROVIDER = provider

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"traceparent": request.headers.get("traceparent", "")})

    app = web.Application()
    app.router.add_get("/engines/{eid}/stats", stats)
    telemetry.instrument_aiohttp_server(app, tracer_provider=provider)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        dev_server = dying_with_us(dev_server_path(), tmp_path / "temporal")
        async with await WorkflowEnvironment.start_local(dev_server_existing_path=dev_server) as env:
            client = Client(
                env.client.service_client,
                namespace=env.client.namespace,
                interceptors=telemetry.temporal_interceptors(provider),
            )
            queue = f"tq-{uuid.uuid4()}"
            async with Worker(
                client,
                task_queue=queue,
                workflows=[TracedFetch],
                activities=[fetch_stats],
                workflow_runner=UnsandboxedWorkflowRunner(),
            ):
                with provider.get_tracer("narwhal-restart").start_as_current_span("narwhal-restart start"):
                    traceparent = await client.execute_workflow(
                        TracedFetch.run,
                        str(server.make_url("/engines/e0/stats")),
                        id=f"traced-{uuid.uuid4()}",
                        task_queue=queue,
                    )
    finally:
        await server.close()
        _PROVIDER = None

    spans = list(exporter.get_finished_spans())
    root = next(s for s in spans if s.name == "narwhal-restart start")
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}, [s.name for s in spans]
    server_span = next(s for s in spans if s.name == "GET /engines/{eid}/stats")
    assert server_span.kind == SpanKind.SERVER
    by_id = {s.context.span_id: s for s in spans}
    chain = _parent_chain(server_span, by_id)
    # server ← httpx GET ← RunActivity ← StartActivity ← StartWorkflow ← CLI span (TracingInterceptor
    # parents workflow-side spans on the StartWorkflow span carried in the Temporal headers)
    assert chain[0] == "GET" and by_id[server_span.parent.span_id].kind == SpanKind.CLIENT  # type: ignore[union-attr]
    assert chain[1:] == [
        "RunActivity:fetch_stats",
        "StartActivity:fetch_stats",
        "StartWorkflow:TracedFetch",
        "narwhal-restart start",
    ], chain
    assert any(s.name == "RunWorkflow:TracedFetch" for s in spans)
    assert traceparent.split("-")[2] == f"{by_id[server_span.parent.span_id].context.span_id:016x}"  # type: ignore[union-attr]
