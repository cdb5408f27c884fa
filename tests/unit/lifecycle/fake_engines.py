"""An httpx.MockTransport standing in for a vLLM fleet with attestation sidecars."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from router.attestation import build_attestation

from .helpers import CONTRACT


@dataclass
class FakeEngine:
    iid: str
    start: float
    version: str = "0.0.0-fake"
    healthy: bool = True
    reachable: bool = True
    metrics_ok: bool = True
    model: str = "fake"
    attestation: str = "ok"  # ok | broken | fail
    generation_ok: bool = True
    descriptor_ok: bool = True
    decode_tokens: int = 2
    calls: list[str] = field(default_factory=list)

    def restart(self) -> None:
        self.start += 100.0


class FakeFleet:
    def __init__(self, n: int = 3) -> None:
        self.engines = {f"e{i}": FakeEngine(f"e{i}", 1000.0 + i) for i in range(n)}

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host.split(".")[0]
        eng = self.engines[host]
        path = request.url.path
        eng.calls.append(f"{request.method} {path}")
        if not eng.reachable:
            raise httpx.ConnectError("connection refused", request=request)
        if path == "/health":
            return httpx.Response(200 if eng.healthy else 503)
        if path == "/version":
            return httpx.Response(200, json={"version": eng.version})
        if path == "/metrics":
            if not eng.metrics_ok:
                raise httpx.ConnectError("metrics down", request=request)
            text = f"# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {eng.start}\n"
            return httpx.Response(200, text=text)
        if path == "/att":
            if eng.attestation == "fail":
                return httpx.Response(503)
            doc = build_attestation(CONTRACT, {k: f"fake:{k}" for k in CONTRACT}, eng.version, eng.start)
            if eng.attestation == "broken":
                doc["attestation_digest"] = "sha256:" + "0" * 64
            return httpx.Response(200, json=doc)
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": eng.model}]})
        if path == "/v1/completions":
            body: dict[str, Any] = json.loads(request.content)
            if "kv_transfer_params" in body and body["kv_transfer_params"].get("do_remote_decode"):
                params = (
                    {"remote_engine_id": eng.iid, "remote_block_ids": [1, 2]} if eng.descriptor_ok else {}
                )
                return httpx.Response(200, json={"choices": [{"text": "x", "kv_transfer_params": params}]})
            if body.get("stream"):
                chunks = "".join(
                    f'data: {{"choices":[{{"text":"t","token_ids":[{i}]}}]}}\n\n'
                    for i in range(eng.decode_tokens)
                )
                return httpx.Response(
                    200, text=chunks + "data: [DONE]\n\n", headers={"content-type": "text/event-stream"}
                )
            if not eng.generation_ok:
                return httpx.Response(200, json={"choices": []})
            return httpx.Response(200, json={"choices": [{"text": "x"}]})
        return httpx.Response(404)
