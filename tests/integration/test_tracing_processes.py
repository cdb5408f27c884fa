"""One trace across the real processes: ``narwhal-restart start`` → Temporal (workflow, activity in
``narwhal-worker``) → ``narwhal-serve``'s drain handler → the router's engine calls.

A tiny OTLP/HTTP collector (stdlib HTTP server in a thread, protobuf decoded with
opentelemetry-proto) receives what the processes export; ``OTEL_EXPORTER_OTLP_ENDPOINT`` points at
it. Router and worker are stopped with SIGTERM before the assertions: their graceful stop flushes.
Also covers the worker accepting ``--log-level warning`` (lower case), and a client request's
trace flowing through the router's prefill and decode legs.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from tests.integration.conftest import Temporal, wait_ready_line
from tests.support.fleet import process_start, start_sims, start_supervisor, write_fleet
from tests.support.lifecycle import FAST
from tests.support.procs import proc_group, script
from tests.support.router import start_router

pytestmark = pytest.mark.integration

SERVER, CLIENT = 2, 3  # opentelemetry.proto.trace.v1.Span.SpanKind


@dataclass(frozen=True)
class Exported:
    service: str
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    attributes: dict[str, str]


def _attrs(kvs: list[KeyValue]) -> dict[str, str]:
    out: dict[str, str] = {}
    for kv in kvs:
        v = kv.value
        field = v.WhichOneof("value")
        out[kv.key] = str(getattr(v, field)) if field else ""
    return out


class Collector:
    """OTLP/HTTP receiver: POST /v1/traces (protobuf) is decoded and kept; /v1/metrics is accepted."""

    def __init__(self) -> None:
        self.spans: list[Exported] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path == "/v1/traces":
                    collector.add(ExportTraceServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def add(self, req: ExportTraceServiceRequest) -> None:
        batch: list[Exported] = []
        for rs in req.resource_spans:
            service = _attrs(list(rs.resource.attributes)).get("service.name", "")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    ids = s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex()
                    batch.append(Exported(service, *ids, s.name, s.kind, _attrs(list(s.attributes))))
        with self.lock:
            self.spans.extend(batch)

    def snapshot(self) -> list[Exported]:
        with self.lock:
            return list(self.spans)


@contextmanager
def collector() -> Iterator[Collector]:
    c = Collector()
    c.thread.start()
    try:
        yield c
    finally:
        c.server.shutdown()
        c.server.server_close()


def _url(span: Exported) -> str:
    return span.attributes.get("url.full") or span.attributes.get("http.url", "")


def _is_drain_handler(s: Exported) -> bool:
    return s.service == "narwhal-router" and s.kind == SERVER and s.name == "POST /narwhal/lifecycle/drain"


def _is_engine_call(s: Exported, engine_url: str) -> bool:
    url = _url(s)
    return (
        s.service == "narwhal-router"
        and s.kind == CLIENT
        and url.startswith(engine_url)
        and url.endswith(("/version", "/metrics"))
    )


def run_restart(temporal: Temporal, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [script("narwhal-restart"), "start", "--address", temporal.address, *args],
        capture_output=True, text=True, timeout=90, env={**os.environ, **env},
    )  # fmt: skip


def linked_trace(col: Collector, engine_url: str, within: float = 10.0) -> tuple[str, list[Exported]]:
    """The trace of the CLI span that also holds the drain handler and an engine call."""
    deadline = time.monotonic() + within
    while True:
        spans = col.snapshot()
        for root in (
            s for s in spans if s.service == "narwhal-restart" and s.name == "narwhal-restart start"
        ):
            trace = [s for s in spans if s.trace_id == root.trace_id]
            if any(map(_is_drain_handler, trace)) and any(_is_engine_call(s, engine_url) for s in trace):
                return root.trace_id, trace
        if time.monotonic() > deadline:
            raise AssertionError(f"no linked trace; exported: {sorted({(s.service, s.name) for s in spans})}")
        time.sleep(0.1)


async def test_one_trace_spans_cli_workflow_activity_router_drain_and_engine_call(
    temporal: Temporal, tmp_path: Path
) -> None:
    fleet_name = f"traced-{uuid.uuid4().hex[:6]}"
    queue = f"traced-{uuid.uuid4().hex[:8]}"
    with collector() as col, proc_group(tmp_path) as group:
        otel = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": col.url,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_SERVICE_NAME": "",  # service names come from the processes
        }
        sup, sims = start_supervisor(group, tmp_path, 3)  # e0 prefill, e1 + e2 decode
        target = sims[2]
        fleet = write_fleet(tmp_path, sims, extra=FAST)
        router = start_router(group, fleet, tmp_path, env=otel, wait_ready=True)
        worker = group.start(
            "worker",
            [script("narwhal-worker"), "--address", temporal.address, "--task-queue", queue, "--grace", "2",
             "--log-level", "warning", "--router", f"traced={router.url}"],
            env=otel,
        )  # fmt: skip
        wait_ready_line(worker)
        before = process_start(target.url)
        r = run_restart(
            temporal, otel, "--router", router.url, "--supervisor-url", sup, "--fleet", fleet_name,
            "--engines", target.iid, "--task-queue", queue, "--poll-interval", "0.2", "--wait",
            "--worker-router", "traced",
        )  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        assert process_start(target.url) > before
        assert router.proc.stop() == 0, router.proc.output()[-2000:]  # graceful stop flushes its spans
        assert worker.stop() == 0, worker.output()[-2000:]

        trace_id, trace = linked_trace(col, target.url)
        names = {(s.service, s.name) for s in trace}
        assert ("narwhal-restart", "StartWorkflow:RollingRestart") in names, names
        assert ("narwhal-worker", "RunWorkflow:RollingRestart") in names, names
        assert ("narwhal-worker", "RunWorkflow:EngineRestart") in names, names
        assert ("narwhal-worker", "RunActivity:drain") in names, names
        # the drain handler continues the activity's httpx call, and the engine call is its child
        by_id = {s.span_id: s for s in trace}
        drain = next(s for s in trace if _is_drain_handler(s))
        caller = by_id[drain.parent_id]
        assert caller.service == "narwhal-worker" and caller.kind == CLIENT, caller
        assert by_id[caller.parent_id].name == "RunActivity:drain"
        assert any(_is_engine_call(s, target.url) and s.parent_id == drain.span_id for s in trace), [
            (s.name, _url(s), s.parent_id == drain.span_id) for s in trace if s.service == "narwhal-router"
        ]
        # nothing of this restart ended up in another trace
        assert {s.trace_id for s in col.snapshot() if s.name == "RunActivity:drain"} == {trace_id}


def test_client_trace_flows_through_prefill_and_decode_legs(tmp_path: Path) -> None:
    """A client's ``traceparent`` continues in the router; both engine legs are its CLIENT children."""
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with collector() as col, proc_group(tmp_path) as group:
        sims = start_sims(group, 2, roles=["prefill", "decode"])
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": col.url, "OTEL_BSP_SCHEDULE_DELAY": "200"}
        router = start_router(group, write_fleet(tmp_path, sims), tmp_path, env=otel, wait_ready=True)
        for stream in (False, True):
            r = router.post(
                "/v1/completions",
                {"model": sims[0].model, "prompt": "the narwhal", "max_tokens": 4, "stream": stream},
                headers={"traceparent": f"00-{trace_id}-{parent}-01"},
            )
            assert r.status_code == 200, r.text
        assert router.proc.stop() == 0, router.proc.output()[-2000:]
        spans = [s for s in col.snapshot() if s.trace_id == trace_id]
    servers = [s for s in spans if s.kind == SERVER and s.name == "POST /v1/completions"]
    assert len(servers) == 2 and all(s.parent_id == parent and s.service == "narwhal-router" for s in servers)
    for server in servers:
        legs = sorted(
            _url(s).split("/v1/")[0] for s in spans if s.kind == CLIENT and s.parent_id == server.span_id
        )
        assert legs == sorted(sim.url for sim in sims), [(s.name, _url(s)) for s in spans]
