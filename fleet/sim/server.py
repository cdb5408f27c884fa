"""aiohttp application of the simulated engine: vLLM endpoints plus ``/sim/*`` control endpoints."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import ValidationError

from fleet.contract import sources_for
from fleet.sim.config import Faults
from fleet.sim.generate import Generator, error_response, json_response
from fleet.sim.state import EngineState
from router.attestation import build_attestation

_UNGATED = ("/sim/faults", "/sim/stats", "/sim/requests")


class SimServer:
    def __init__(self, state: EngineState) -> None:
        self.state = state
        self.gen = Generator(state)
        cfg = state.cfg
        self._attestation = build_attestation(
            cfg.contract, sources_for(cfg.contract), cfg.version, state.process_start, launch=cfg.launch()
        )

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._hang_gate], client_max_size=16 * 1024 * 1024)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/ping", self.health)
        r.add_get("/version", self.version)
        r.add_get("/metrics", self.metrics)
        r.add_get("/v1/models", self.models)
        if self.state.cfg.attestation:
            r.add_get("/v1/attestation", self.attestation)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_post("/tokenize", self.tokenize)
        r.add_post("/sim/kv/pull", self.kv_pull)
        r.add_get("/sim/faults", self.get_faults)
        r.add_post("/sim/faults", self.post_faults)
        r.add_post("/sim/faults/reset", self.reset_faults)
        r.add_get("/sim/stats", self.stats)
        r.add_get("/sim/requests", self.requests)
        r.add_post("/sim/requests/reset", self.reset_requests)
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        await self.gen.start()

    async def _on_shutdown(self, _app: web.Application) -> None:
        self.state.unhung.set()  # let hung requests finish so SIGTERM exits promptly

    async def _on_cleanup(self, _app: web.Application) -> None:
        await self.gen.close()

    @web.middleware
    async def _hang_gate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith(_UNGATED):
            await self.state.unhung.wait()
        return await handler(request)

    async def health(self, _request: web.Request) -> web.Response:
        if self.state.faults.health_fail:
            return web.Response(status=503)
        return web.Response(status=200)

    async def version(self, _request: web.Request) -> web.Response:
        return json_response({"version": self.state.cfg.version})

    async def metrics(self, _request: web.Request) -> web.Response:
        st = self.state
        labels = f'{{engine="0",model_name="{st.cfg.model}"}}'
        usage = len(st.kv) / st.kv.capacity
        lines = [
            "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.",
            "# TYPE process_start_time_seconds gauge",
            f"process_start_time_seconds {st.process_start!r}",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{labels} {float(st.stats.running)}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{labels} {float(st.stats.waiting)}",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{labels} {usage}",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{labels} {float(st.stats.prompt_tokens)}",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{labels} {float(st.stats.generation_tokens)}",
            "",
        ]
        return web.Response(text="\n".join(lines), content_type="text/plain", charset="utf-8")

    async def models(self, _request: web.Request) -> web.Response:
        st = self.state
        model = st.served_model
        entry = {
            "id": model,
            "object": "model",
            "created": int(st.process_start),
            "owned_by": "vllm",
            "root": model,
            "parent": None,
            "max_model_len": st.cfg.max_model_len,
        }
        return json_response({"object": "list", "data": [entry]})

    async def attestation(self, _request: web.Request) -> web.Response:
        mode = self.state.faults.attestation
        if mode == "fail":
            return error_response(503, "attestation unavailable", "ServiceUnavailableError")
        doc: dict[str, Any] = self._attestation
        if mode == "broken":
            doc = {**doc, "contract": {**doc["contract"], "engine_version": "tampered"}}
        return json_response(doc)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.gen.handle(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self.gen.handle(request, chat=True)

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
            text = body.get("prompt") if isinstance(body, dict) else None
        except orjson.JSONDecodeError:
            text = None
        if not isinstance(text, str):
            return error_response(400, "prompt must be a string", "BadRequestError", "prompt")
        n = len(text) // 4 + 1
        return json_response(
            {"count": n, "max_model_len": self.state.cfg.max_model_len, "tokens": list(range(n))}
        )

    async def kv_pull(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            self.state.stats.kv_pulls_refused += 1
            return error_response(400, "pull body must be a JSON object", "BadRequestError")
        err = self.state.serve_pull(body.get("engine_id"), body.get("block_ids"), body.get("kv_layout"))
        if err is not None:
            return error_response(409, err, "KVTransferError")
        return json_response({"ok": True, "engine_id": self.state.engine_id})

    async def get_faults(self, _request: web.Request) -> web.Response:
        return json_response(self.state.faults.model_dump())

    async def post_faults(self, request: web.Request) -> web.Response:
        try:
            patch = orjson.loads(await request.read())
            if not isinstance(patch, dict):
                raise ValueError("faults must be a JSON object")
            faults = self.state.faults.merged(patch)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(x) for x in err["loc"])
            return error_response(400, f"invalid fault {where}: {err['msg']}", "BadRequestError", where)
        except ValueError as exc:
            return error_response(400, str(exc), "BadRequestError")
        self.state.set_faults(faults)
        return json_response(faults.model_dump())

    async def reset_faults(self, _request: web.Request) -> web.Response:
        self.state.set_faults(Faults())
        return json_response(self.state.faults.model_dump())

    async def requests(self, _request: web.Request) -> web.Response:
        """The completion requests this engine received, oldest first (the last 256): each one's
        path, ``x-request-id`` header and body exactly as sent (text)."""
        rows = [
            {"path": path, "x_request_id": rid, "body": body.decode("utf-8", "replace")}
            for path, rid, body in self.state.received
        ]
        return json_response({"requests": rows})

    async def reset_requests(self, _request: web.Request) -> web.Response:
        self.state.received.clear()
        return json_response({"requests": []})

    async def stats(self, _request: web.Request) -> web.Response:
        st = self.state
        doc = st.stats.document()
        doc.update(
            iid=st.cfg.iid,
            engine_id=st.engine_id,
            process_start=st.process_start,
            kv_layout=st.kv_layout,
            kv_blocks_held=len(st.kv),
        )
        return json_response(doc)
