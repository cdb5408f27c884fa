"""Data-plane engine client (vLLM dialect, NIXL descriptor hand-off, spec §11.3).

One shared ``aiohttp.ClientSession`` (pooled keep-alive connections, limit
``serving.max_connections``) for the prefill and decode legs, and a small separate session for
probes so a saturated data plane never starves health checks. Failures are raised as
:class:`LegFailure`, classified for the breaker (spec §9.1).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import aiohttp
import orjson

from router.config import FleetConfig

# Client fields the prefill leg never forwards (spec §11.3).
PREFILL_DROP = frozenset({"stream_options", "min_tokens", "n", "best_of", "max_completion_tokens"})
_JSON = "application/json"
_CLIENT_FAULT_STATUSES = frozenset({400, 413, 422})


class LegFailure(Exception):
    """A failed engine leg. ``kind`` is a breaker class, or ``rejected`` (engine 4xx: client's fault)."""

    def __init__(self, kind: str, phase: str, iid: str, detail: str, status: int | None = None) -> None:
        super().__init__(f"{phase} leg on {iid}: {detail}")
        self.kind = kind
        self.phase = phase
        self.iid = iid
        self.detail = detail
        self.status = status
        self.timed_out = False
        self.unreachable = False

    @property
    def reason(self) -> str:
        """The ``failed`` counter reason (spec §8) when this failure ends the request."""
        if self.kind == "connection":
            return "engine_unreachable" if self.unreachable else "engine_connection"
        if self.kind == "timeout" or self.timed_out:
            return "engine_timeout"
        if self.kind == "overload":
            return "engine_overloaded"
        if self.kind == "rejected":
            return "engine_rejected"
        if self.kind == "inference_status":
            return "engine_error"
        return "invalid_response"

    @property
    def client_fault(self) -> bool:
        """The engine refused the client's body (400/413/422): answered as is, never retried.

        On the prefill leg any such refusal; on the decode leg only one naming a limit of the
        request (context length, ``max_tokens``). Any other decode-leg 4xx follows a successful
        prefill of the same body, so it is the hand-off's or the engine's fault: 502 and retryable.
        """
        if self.kind != "rejected" or self.status not in _CLIENT_FAULT_STATUSES:
            return False
        return self.phase == "prefill" or _names_a_request_limit(self.detail)

    @property
    def client_status(self) -> int:
        if self.client_fault and self.status is not None:
            return self.status
        return 504 if self.reason == "engine_timeout" else 502


# A decode-leg 4xx whose message names a limit of the request itself (vLLM's context-length
# refusal) is the client's fault too: every engine of the model would refuse it the same way.
_REQUEST_LIMIT_MARKERS = ("maximum context length", "max_tokens", "max_completion_tokens")


def _names_a_request_limit(detail: str) -> bool:
    text = detail.lower()
    return any(marker in text for marker in _REQUEST_LIMIT_MARKERS)


def _classify(exc: BaseException, phase: str, iid: str) -> LegFailure:
    if isinstance(exc, aiohttp.ConnectionTimeoutError | aiohttp.ClientConnectorError):
        f = LegFailure("connection", phase, iid, f"cannot connect: {type(exc).__name__}")
        f.unreachable = True
        return f
    if isinstance(exc, TimeoutError):
        f = LegFailure("stream" if phase == "decode" else "timeout", phase, iid, "engine timed out")
        f.timed_out = True
        return f
    return LegFailure("connection", phase, iid, f"{type(exc).__name__}: {exc}")


def _status_failure(status: int, text: bytes, phase: str, iid: str) -> LegFailure:
    detail = f"HTTP {status}: {_error_message(text)}"
    if status in (408, 429):
        return LegFailure("overload", phase, iid, detail, status)
    if 400 <= status < 500:
        return LegFailure("rejected", phase, iid, detail, status)
    return LegFailure("inference_status", phase, iid, detail, status)


def _error_message(text: bytes) -> str:
    try:
        doc = orjson.loads(text)
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])[:300]
        if isinstance(err, str):
            return err[:300]
    except orjson.JSONDecodeError:
        pass
    return text[:300].decode("utf-8", "replace")


def find_descriptor(doc: Any) -> dict[str, Any] | None:
    """The KV descriptor of a prefill answer (top level or ``choices[0]``), if well formed."""
    if not isinstance(doc, dict):
        return None
    desc = doc.get("kv_transfer_params")
    if desc is None:
        choices = doc.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            desc = choices[0].get("kv_transfer_params")
    if not isinstance(desc, dict):
        return None
    if not isinstance(desc.get("remote_engine_id"), str) or not _block_ids_ok(desc.get("remote_block_ids")):
        return None
    return desc


def _block_ids_ok(ids: Any) -> bool:
    if not isinstance(ids, list):
        return False
    for item in ids:
        group = item if isinstance(item, list) else (item,)
        for b in group:
            if not isinstance(b, int) or isinstance(b, bool) or b < 0:
                return False
    return True


def prefill_body(body: dict[str, Any], model: str) -> bytes:
    out = {k: v for k, v in body.items() if k not in PREFILL_DROP}
    out["model"] = model
    out["max_tokens"] = 1
    out["stream"] = False
    out["kv_transfer_params"] = {"do_remote_decode": True}
    return orjson.dumps(out)


def decode_body(body: dict[str, Any], model: str, descriptor: dict[str, Any] | None) -> bytes:
    out = dict(body)
    out["model"] = model
    out["stream"] = True
    out["return_token_ids"] = True
    out["stream_interval"] = 1
    if descriptor is not None:
        out["kv_transfer_params"] = descriptor
    else:
        out.pop("kv_transfer_params", None)
    return orjson.dumps(out)


class EngineClient:
    """Pooled HTTP client for engine legs and probes. A router component (no routes)."""

    def __init__(self, config: FleetConfig, max_connections: int | None = None) -> None:
        self.config = config
        self.max_connections = max_connections or config.serving.max_connections
        self.headers: dict[str, str] = {"content-type": _JSON}
        key_env = config.engine.engine_api_key_env
        if key_env and os.environ.get(key_env):
            self.headers["authorization"] = f"Bearer {os.environ[key_env]}"
        eng, srv = config.engine, config.serving
        self.prefill_timeout = aiohttp.ClientTimeout(
            total=srv.prefill_timeout_s, sock_connect=eng.health_timeout_s
        )
        self.decode_timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=eng.health_timeout_s, sock_read=eng.decode_read_timeout_s
        )
        self.health_timeout = aiohttp.ClientTimeout(total=eng.health_timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._control: aiohttp.ClientSession | None = None

    # -- component protocol -----------------------------------------------------------------
    def add_routes(self, app: Any) -> None:
        return None

    async def start(self) -> None:
        if self._session is None:
            self._session = self._new_session(self.max_connections)
            self._control = self._new_session(32)

    async def stop(self) -> None:
        for s in (self._session, self._control):
            if s is not None:
                await s.close()
        self._session = self._control = None

    @staticmethod
    def _new_session(limit: int) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0, keepalive_timeout=60.0)
        # No Accept-Encoding: the router relays bodies as they come (auto_decompress=False), so an
        # engine must not compress them; fewer auto headers is also less work per leg.
        return aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),  # engines' cookies are never sent back
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
        )

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("engine client not started")
        return self._session

    @property
    def control(self) -> aiohttp.ClientSession:
        if self._control is None:
            raise RuntimeError("engine client not started")
        return self._control

    def _headers(self, xrid: str) -> dict[str, str]:
        h = self.headers.copy()
        h["x-request-id"] = xrid
        return h

    # -- legs -------------------------------------------------------------------------------
    async def prefill(self, iid: str, url: str, path: str, body: bytes, xrid: str) -> dict[str, Any]:
        """Run the prefill leg; returns the KV descriptor or raises :class:`LegFailure`."""
        try:
            async with self.session.post(
                url + path, data=body, headers=self._headers(xrid), timeout=self.prefill_timeout
            ) as resp:
                raw = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _classify(exc, "prefill", iid) from None
        if status != 200:
            raise _status_failure(status, raw, "prefill", iid)
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise LegFailure("kv_handoff", "prefill", iid, "no handoff: prefill answer is not JSON") from None
        desc = find_descriptor(doc)
        if desc is None:
            raise LegFailure("kv_handoff", "prefill", iid, "no handoff descriptor in the prefill answer")
        return desc

    async def open_decode(self, iid: str, url: str, path: str, body: bytes, xrid: str) -> DecodeStream:
        """Start the streamed decode leg; the caller must ``close()`` the returned stream."""
        try:
            resp = await self.session.post(
                url + path, data=body, headers=self._headers(xrid), timeout=self.decode_timeout
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _classify(exc, "decode", iid) from None
        if resp.status != 200:
            try:
                raw = await resp.content.read(65536)
            except (aiohttp.ClientError, TimeoutError):
                raw = b""
            finally:
                resp.close()
            raise _status_failure(resp.status, raw, "decode", iid)
        return DecodeStream(resp, iid)

    # -- probes -----------------------------------------------------------------------------
    async def health(self, url: str) -> bool:
        try:
            async with self.control.get(url + "/health", timeout=self.health_timeout) as resp:
                await resp.read()
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def generate_one(self, url: str) -> bool:
        """A direct 1-token generation: 200 with a non-empty ``choices`` list."""
        body = orjson.dumps(
            {"model": self.config.model, "prompt": "narwhal probe", "max_tokens": 1, "temperature": 0.0}
        )
        try:
            async with self.control.post(
                url + "/v1/completions",
                data=body,
                headers=self._headers("narwhal-probe"),
                timeout=self.prefill_timeout,
            ) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    return False
            doc = orjson.loads(raw)
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
            return False
        return isinstance(doc, dict) and isinstance(doc.get("choices"), list) and bool(doc["choices"])


_SEP = b"\n\n"
_MAX_EVENT = 1 << 20  # one SSE event larger than this is a broken stream, not a token


def _event_payload(event: bytes, unterminated: bool = False) -> bytes | None:
    """The data of one SSE event (without its blank-line terminator); None when it has none.

    ``unterminated``: the bytes left at EOF, framed as the per-event reader this replaced did.
    """
    if event.startswith(b"data:") and (
        event.count(b"\n", 0, -2) == 0 if unterminated else b"\n" not in event
    ):
        return event[5:].strip()
    # multi-line event: comments, event names, several data lines
    payload = b"\n".join(line[5:].strip() for line in event.splitlines() if line.startswith(b"data:"))
    return payload or None


class DecodeStream:
    """Server-sent events of one decode leg.

    ``next_events()`` yields every complete ``data:`` payload that has arrived (at least one), so a
    relay can forward a burst of frames with one write; ``next_data()`` yields them one by one.
    Events are split on ``\\n\\n`` over the raw body chunks (no per-line reads).
    """

    __slots__ = ("_buf", "_done", "_ready", "iid", "resp")

    def __init__(self, resp: aiohttp.ClientResponse, iid: str) -> None:
        self.resp = resp
        self.iid = iid
        self._buf = b""  # bytes of an incomplete event
        self._ready: list[bytes] = []  # complete payloads not handed out yet
        self._done = False  # [DONE] seen (anything after it is ignored)

    async def next_data(self) -> bytes | None:
        """The next data payload; None after ``[DONE]``. Raises LegFailure(stream) otherwise."""
        if not self._ready and not self._done:
            await self._fill()
        if self._ready:
            return self._ready.pop(0)
        return None

    async def next_events(self) -> tuple[list[bytes], bool]:
        """(payloads, done): all complete payloads so far, waiting for at least one event.

        ``done`` is True once ``[DONE]`` was read (``payloads`` are the ones before it). Raises
        LegFailure(stream) when the stream fails or ends without ``[DONE]``.
        """
        if not self._ready and not self._done:
            await self._fill()
        return self.ready()

    def ready(self) -> tuple[list[bytes], bool]:
        """What ``next_events`` would return, without waiting (possibly ``([], False)``)."""
        out = self._ready
        self._ready = []
        return out, self._done

    async def _fill(self) -> None:
        """Read until at least one payload (or [DONE]) is complete."""
        content = self.resp.content
        try:
            while True:
                chunk = await content.readany()
                if not chunk:  # EOF: an unterminated last event still counts, like a readuntil()
                    tail, self._buf = self._buf, b""
                    if tail:
                        self._add(tail, unterminated=True)
                    if self._ready or self._done:
                        return
                    raise LegFailure("stream", "decode", self.iid, "stream ended without [DONE]")
                buf = self._buf + chunk if self._buf else chunk
                start = 0
                while (end := buf.find(_SEP, start)) != -1:
                    if self._add(buf[start:end]):
                        self._buf = b""
                        return
                    start = end + 2
                self._buf = buf[start:] if start else buf
                if self._ready:
                    return
                if len(self._buf) > _MAX_EVENT:
                    raise LegFailure("stream", "decode", self.iid, "stream event too large")
        except (aiohttp.ClientError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            failure = _classify(exc, "decode", self.iid)
            failure.kind = "stream"
            if isinstance(exc, TimeoutError):
                failure.detail = "decode read timed out"
            raise failure from None

    def _add(self, event: bytes, unterminated: bool = False) -> bool:
        """Queue one event's payload; True when it is [DONE] (the stream's end)."""
        payload = _event_payload(event, unterminated)
        if payload is None:
            return False
        if payload == b"[DONE]":
            self._done = True
            return True
        self._ready.append(payload)
        return False

    def close(self) -> None:
        """Drop the connection (not back to the pool): the engine sees the client go away."""
        self.resp.close()

    def release(self) -> None:
        """After [DONE]: return the connection to the pool."""
        self.resp.release()
