"""The completion path: admission seat, NIXL-style KV pull for decode legs, buffered or SSE output."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from fleet.sim import answers
from fleet.sim import openai as oai
from fleet.sim.state import (
    EngineState,
    flat_block_ids,
    iter_tokens,
    output_tokens,
    prompt_token_ids,
    token_text,
)

PULL_TIMEOUT_S = 5.0
_GARBLED = {"do_remote_prefill": True, "remote_engine_id": 0, "remote_block_ids": "garbled"}


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(obj), status=status, content_type="application/json", headers=headers
    )


def error_response(status: int, message: str, type_: str, param: str | None = None) -> web.Response:
    return json_response(oai.error_body(status, message, type_, param), status=status)


class Generator:
    def __init__(self, state: EngineState) -> None:
        self.state = state
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            timeout=aiohttp.ClientTimeout(total=PULL_TIMEOUT_S),
            json_serialize=lambda o: orjson.dumps(o).decode(),
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def pull(self, kv: dict[str, Any]) -> web.Response | None:
        """Consumer side of the hand-off: fetch the producer's blocks or return the error response."""
        st = self.state
        ids = flat_block_ids(kv.get("remote_block_ids"))
        eid, host, port = kv.get("remote_engine_id"), kv.get("remote_host"), kv.get("remote_port")
        if not isinstance(port, int) or isinstance(port, bool):
            port = None
        if (
            not isinstance(eid, str)
            or not eid
            or not ids
            or not isinstance(host, str)
            or not host
            or port is None
        ):
            st.stats.kv_pulls_failed += 1
            msg = "invalid kv_transfer_params: remote_engine_id, remote_block_ids, remote_host, remote_port required"
            return error_response(400, msg, "BadRequestError", "kv_transfer_params")
        layout = kv.get("kv_layout")
        if layout is not None and layout != st.kv_layout:
            st.stats.kv_pulls_failed += 1
            msg = f"incompatible KV layout: producer {layout!r}, this engine {st.kv_layout!r}"
            return error_response(400, msg, "BadRequestError", "kv_transfer_params")
        err = await self._fetch(eid, ids, host, port)
        if err is not None:
            st.stats.kv_pulls_failed += 1
            return error_response(500, f"KV transfer from {eid} failed: {err}", "InternalServerError")
        st.stats.kv_pulls_done += 1
        return None

    async def _fetch(self, eid: str, ids: list[int], host: str, port: int) -> str | None:
        st = self.state
        if eid == st.engine_id:
            return st.serve_pull(eid, ids, st.kv_layout)
        assert self.session is not None
        url = f"http://{host}:{port}/sim/kv/pull"
        payload = {"engine_id": eid, "block_ids": ids, "kv_layout": st.kv_layout}
        try:
            async with self.session.post(url, json=payload) as resp:
                if resp.status == 200:
                    return None
                try:
                    msg = str((await resp.json())["error"]["message"])
                except (ValueError, KeyError, TypeError, aiohttp.ContentTypeError):
                    msg = f"HTTP {resp.status}"
                return msg
        except (aiohttp.ClientError, TimeoutError) as exc:
            return f"producer {host}:{port} unreachable ({type(exc).__name__})"

    async def handle(self, request: web.Request, chat: bool) -> web.StreamResponse:
        st = self.state
        raw = await request.read()
        st.record(request.path, request.headers.get("x-request-id"), raw)
        try:
            doc = orjson.loads(raw)
            p = oai.parse(doc, chat)
        except orjson.JSONDecodeError:
            return error_response(400, "request body is not valid JSON", "BadRequestError")
        except oai.RequestError as exc:
            return error_response(exc.status, exc.message, exc.type, exc.param)
        st.stats.requests[p.kind] += 1
        if p.model is not None and p.model != st.served_model:
            return error_response(404, f"The model `{p.model}` does not exist.", "NotFoundError", "model")
        limit = st.cfg.max_model_len
        if p.prompt_tokens + p.max_tokens > limit:  # as vLLM: checked before any work is queued
            msg = (
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{p.prompt_tokens + p.max_tokens} tokens ({p.prompt_tokens} in the messages, "
                f"{p.max_tokens} in the completion). Please reduce the length of the messages or completion."
            )
            return error_response(400, msg, "BadRequestError", "max_tokens")
        if st.should_error():
            st.stats.errors += 1
            return error_response(500, "simulated engine failure", "InternalServerError")
        st.stats.waiting += 1
        async with st.seats:
            st.stats.waiting -= 1
            st.stats.running += 1
            try:
                if p.kind == "decode" and p.kv_params is not None:
                    failed = await self.pull(p.kv_params)
                    if failed is not None:
                        return failed
                if p.kind != "prefill" and not st.faults.generation_fail and answers.wants_rich(doc):
                    return await self._rich(request, p, answers.read_request(doc, chat))
                return await self._respond(request, p)
            finally:
                st.stats.running -= 1

    def _descriptor(self, p: oai.Parsed) -> dict[str, Any] | None:
        if p.kind != "prefill":
            return None
        broken = self.state.faults.break_descriptor
        if broken == "garbled":
            return dict(_GARBLED)
        if broken:
            return None
        return self.state.descriptor(p.prompt_tokens)

    async def _respond(self, request: web.Request, p: oai.Parsed) -> web.StreamResponse:
        st, cfg = self.state, self.state.cfg
        slow = st.faults.slow_ms
        prefill_ms = cfg.ttft_base_ms + (0 if p.kind == "decode" else cfg.ttft_per_token_ms * p.prompt_tokens)
        ttft = (prefill_ms + slow) / 1000
        itl = (cfg.itl_ms + slow) / 1000
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex
        meta = oai.Meta(("chatcmpl-" if p.chat else "cmpl-") + rid, int(time.time()), st.served_model, p.chat)
        prompt_ids = prompt_token_ids(p.key, p.prompt_tokens) if p.return_token_ids else None
        empty = st.faults.generation_fail
        headers = {"x-request-id": rid}
        if not p.stream:
            tokens = output_tokens(p.key, cfg.seed, p.max_tokens)  # bounded by max_model_len above
            await asyncio.sleep(ttft + itl * (len(tokens) - 1))
            await st.unhung.wait()
            kv = self._descriptor(p)
            text = "".join(token_text(t) for t in tokens)
            self._account(p, 0 if empty else len(tokens))
            body = oai.full_body(meta, text, tokens, prompt_ids, p.prompt_tokens, kv, empty)
            if st.faults.stall_body and p.kind != "prefill":
                return await self._stalled(request, orjson.dumps(body), headers)
            return json_response(body, headers=headers)
        lazy = iter_tokens(p.key, cfg.seed, p.max_tokens)  # nothing allocated per token up front
        return await self._stream(request, p, meta, lazy, prompt_ids, ttft, itl, headers)

    async def _rich(self, request: web.Request, p: oai.Parsed, r: answers.Request) -> web.StreamResponse:
        """An answer that uses sampling/output parameters (``answers.py``), paced like the plain one."""
        st, cfg = self.state, self.state.cfg
        slow = st.faults.slow_ms
        prefill_ms = cfg.ttft_base_ms + (0 if p.kind == "decode" else cfg.ttft_per_token_ms * p.prompt_tokens)
        ttft, itl = (prefill_ms + slow) / 1000, (cfg.itl_ms + slow) / 1000
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex
        meta = oai.Meta(("chatcmpl-" if p.chat else "cmpl-") + rid, int(time.time()), st.served_model, p.chat)
        choices = answers.generate(r, p.key, cfg.seed, p.max_tokens)
        generated = sum(len(c.tokens) for c in choices)
        headers = {"x-request-id": rid}
        if not p.stream:
            await asyncio.sleep(ttft + itl * (max((len(c.tokens) for c in choices), default=1) - 1))
            await st.unhung.wait()
            self._account(p, generated)
            body = answers.full_body(r, meta.head(chunk=False), choices, p.prompt_tokens, p.return_token_ids)
            if st.faults.stall_body:
                return await self._stalled(request, orjson.dumps(body), headers)
            return json_response(body, headers=headers)
        eol = _EOLS[cfg.sse_line_ending]
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
        )
        await resp.prepare(request)
        st.stats.active_streams += 1
        try:
            steps = answers.chunks(r, meta.head(chunk=True), choices, p.prompt_tokens, p.return_token_ids)
            for i, step in enumerate(steps):
                await asyncio.sleep(ttft if i == 0 else itl)
                await st.unhung.wait()
                await _write(request, resp, eol, b"".join(answers.sse(c) for c in step))
            if p.include_usage:
                await _write(request, resp, eol, oai.usage_chunk(meta, p.prompt_tokens, generated))
            await _write(request, resp, eol, oai.DONE)
            await resp.write_eof()
            self._account(p, generated)
        except ConnectionError:
            st.stats.cancelled_streams += 1
        except asyncio.CancelledError:
            st.stats.cancelled_streams += 1
            raise
        finally:
            st.stats.active_streams -= 1
        return resp

    async def _stalled(
        self, request: web.Request, body: bytes, headers: dict[str, str]
    ) -> web.StreamResponse:
        """Fault ``stall_body``: the head and half the body, then nothing until the fault is cleared."""
        resp = web.StreamResponse(headers={"Content-Type": "application/json", **headers})
        resp.content_length = len(body)
        await resp.prepare(request)
        await resp.write(body[: len(body) // 2])
        await self.state.unstalled.wait()
        await resp.write(body[len(body) // 2 :])
        await resp.write_eof()
        return resp

    def _account(self, p: oai.Parsed, n: int) -> None:
        self.state.stats.completed += 1
        self.state.stats.prompt_tokens += p.prompt_tokens
        self.state.stats.generation_tokens += n

    async def _stream(
        self,
        request: web.Request,
        p: oai.Parsed,
        meta: oai.Meta,
        tokens: Iterator[int],
        prompt_ids: list[int] | None,
        ttft: float,
        itl: float,
        headers: dict[str, str],
    ) -> web.StreamResponse:
        st = self.state
        eol = _EOLS[st.cfg.sse_line_ending]
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
        )
        await resp.prepare(request)
        st.stats.active_streams += 1
        sent = 0
        try:
            if st.faults.generation_fail:
                await _write(request, resp, eol, oai.usage_chunk(meta, p.prompt_tokens, 0))
            else:
                for i, tok in enumerate(tokens):
                    await asyncio.sleep(ttft if i == 0 else itl)
                    await st.unhung.wait()
                    last = i == p.max_tokens - 1
                    ids = [tok] if p.return_token_ids else None
                    frame = oai.chunk(
                        meta,
                        token_text(tok),
                        ids,
                        "length" if last else None,
                        role=p.chat and i == 0,
                        prompt_ids=prompt_ids if i == 0 else None,
                    )
                    if last and p.kind == "prefill":
                        obj = orjson.loads(frame[6:])
                        obj["kv_transfer_params"] = self._descriptor(p)
                        frame = oai.sse(obj)
                    await _write(request, resp, eol, frame)
                    sent += 1
                if p.include_usage:
                    await _write(request, resp, eol, oai.usage_chunk(meta, p.prompt_tokens, sent))
            await _write(request, resp, eol, oai.DONE)
            await resp.write_eof()
            self._account(p, sent)
        except ConnectionError:  # reset, or lost while waiting for the reader to drain
            st.stats.cancelled_streams += 1
        except asyncio.CancelledError:
            st.stats.cancelled_streams += 1
            raise
        finally:
            st.stats.active_streams -= 1
        return resp


_EOLS = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}


async def _write(request: web.Request, resp: web.StreamResponse, eol: bytes, data: bytes) -> None:
    if eol != b"\n":  # SSE line ends may be CRLF or CR too (frames hold no raw LF but their own)
        data = data.replace(b"\n", eol)
    transport = request.transport
    if transport is None or transport.is_closing():
        raise ConnectionResetError("client closed the stream")
    await resp.write(data)
