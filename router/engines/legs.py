"""Data-plane engine client (vLLM dialect, NIXL descriptor hand-off, spec §11.3).

The prefill and decode legs go over the router's own keep-alive pool (``engines/wire.py``; at
most ``serving.max_connections`` connections kept open). Health checks and the direct generation
probe go through the engine-control client (router/engines/control.py, its own connection pool),
so a saturated data plane never starves them. Failures are raised as :class:`LegFailure`,
classified for the breaker (spec §9.1).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from router import telemetry
from router.config import FleetConfig
from router.engines.sse import SSEFramer
from router.engines.wire import (
    ConnectFailed,
    ConnectionLost,
    DeadlineExceeded,
    EnginePool,
    Response,
    ResponseTooLarge,
    WireError,
)
from router.serving.params import PREFILL_DROP  # client fields the prefill leg never gets (§11.3)
from router.tasks import Tasks

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
        self.deadline = False  # the caller's bound on the leg passed (e.g. no first token in time)

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
        if self.kind == "response_limit":
            return "response_limit"
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
    def final(self) -> bool:
        """Never retried on another engine: the client's fault, or an answer over the byte limit."""
        return self.client_fault or self.kind == "response_limit"

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
    if isinstance(exc, ConnectFailed | aiohttp.ConnectionTimeoutError | aiohttp.ClientConnectorError):
        f = LegFailure("connection", phase, iid, f"cannot connect: {type(exc).__name__}")
        f.unreachable = True
        return f
    if isinstance(exc, TimeoutError):
        f = LegFailure("stream" if phase == "decode" else "timeout", phase, iid, "engine timed out")
        f.timed_out = True
        f.deadline = isinstance(exc, DeadlineExceeded)
        return f
    if isinstance(exc, WireError):
        return LegFailure("connection", phase, iid, str(exc))
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
    if ids and set(map(type, ids)) == {int}:  # the usual flat list: checked at C speed
        return bool(min(ids) >= 0)
    for item in ids:
        group = item if isinstance(item, list) else (item,)
        for b in group:
            if not isinstance(b, int) or isinstance(b, bool) or b < 0:
                return False
    return True


_REMOTE_DECODE = {"do_remote_decode": True}


def prefill_body(body: dict[str, Any], model: str) -> bytes:
    out = (
        body.copy()
        if PREFILL_DROP.isdisjoint(body)
        else {k: v for k, v in body.items() if k not in PREFILL_DROP}
    )
    out["model"] = model
    out["max_tokens"] = 1
    out["stream"] = False
    out["kv_transfer_params"] = _REMOTE_DECODE
    return orjson.dumps(out)


# What a streamed decode leg adds to the client's body: the router counts tokens on token_ids.
_STREAM_SET: dict[str, Any] = {"stream": True, "return_token_ids": True, "stream_interval": 1}


def decode_request(
    raw: bytes,
    body: dict[str, Any],
    model: str,
    descriptor: dict[str, Any] | None,
    model_given: bool = True,
) -> bytes:
    """The decode leg's body: the client's own bytes with only what the PD split must set spliced
    in before the closing brace — ``kv_transfer_params`` (the descriptor; none when the decode
    runs on the producer itself), ``model`` when the client left it out, and for a streamed leg
    ``return_token_ids``/``stream_interval`` — so every client field, number and unknown field
    reaches the engine exactly as the client wrote it. A set field the client gave another value
    (e.g. ``"return_token_ids": false``) cannot be spliced without a duplicate key: then the body
    is rebuilt from the parsed document (same values; orjson writes numbers in shortest form)."""
    add: dict[str, Any] = {}
    if not model_given:
        add["model"] = model
    if body.get("stream") is True:
        for key, value in _STREAM_SET.items():
            have = body.get(key, _MISSING)
            if have is _MISSING:
                add[key] = value
            elif have != value or type(have) is not type(value):
                return decode_body(body, model, descriptor)
    if descriptor is not None:
        add["kv_transfer_params"] = descriptor
    end = raw.rstrip().rfind(b"}")
    if not add or end < 1:
        return raw if end >= 1 else decode_body(body, model, descriptor)
    extra = orjson.dumps(add)[1:-1]
    head = raw[:end].rstrip()
    sep = b"" if head.endswith(b"{") else b","
    return b"".join((head, sep, extra, raw[end:]))


_MISSING = object()


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


class _Target:
    """A prebuilt request head for one (engine URL, path): address, TLS and the constant headers."""

    __slots__ = ("head", "key", "ssl", "url")

    def __init__(self, url: str, path: str, headers: dict[str, str]) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"engine URL {url!r} is not http(s)://host[:port]")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self.url = url + path
        self.key = (parts.hostname, port)
        self.ssl = parts.scheme == "https"
        host = parts.netloc.rsplit("@", 1)[-1]
        lines = [f"POST {parts.path.rstrip('/')}{path} HTTP/1.1", f"host: {host}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self.head = ("\r\n".join(lines) + "\r\ncontent-length: ").encode("latin-1")

    def request(self, body: bytes, xrid: str, extra: dict[str, str] | None) -> bytes:
        tail = b"\r\nx-request-id: " + xrid.encode("latin-1")
        if extra:
            tail += "".join(f"\r\n{k}: {v}" for k, v in extra.items()).encode("latin-1")
        return b"".join((self.head, str(len(body)).encode(), tail, b"\r\n\r\n", body))


class EngineClient:
    """Engine legs over the router's own keep-alive pool (``engines/wire.py``).

    A router component (no routes). The leg requests are built from a per-(engine, path) template;
    decode streams are watched by one task (``decode_read_timeout_s`` between body bytes) instead of
    a timer per read.
    """

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.max_connections = config.serving.max_connections  # the pool's open-connection bound
        self.headers: dict[str, str] = {"content-type": _JSON}
        key_env = config.engine.engine_api_key_env
        if key_env and os.environ.get(key_env):
            self.headers["authorization"] = f"Bearer {os.environ[key_env]}"
        eng, srv = config.engine, config.serving
        self.prefill_timeout_s = srv.prefill_timeout_s
        self.decode_read_timeout_s = eng.decode_read_timeout_s
        self.max_response_bytes = srv.max_response_bytes
        self.pool = EnginePool(connect_timeout=eng.health_timeout_s, max_open=self.max_connections)
        self._targets: dict[tuple[str, str], _Target] = {}
        self._watched: set[Response] = set()  # legs in flight (the watchdog's list)
        self._watching = asyncio.Event()  # set while legs are in flight: an idle watchdog sleeps
        self._tasks = Tasks(logging.getLogger("narwhal.engines"))  # the stream watchdog
        self._ssl: ssl.SSLContext | None = None
        self.traced = False  # OpenTelemetry CLIENT span + traceparent per leg (set at start)

    # -- component protocol -----------------------------------------------------------------
    def add_routes(self, app: Any) -> None:
        return None

    async def start(self) -> None:
        if not self._tasks.running:
            self._tasks.spawn(self._watch_streams(), "narwhal-leg-watchdog")
            self.traced = telemetry.tracing_installed()

    async def stop(self) -> None:
        await self._tasks.stop()
        self.pool.close()

    def _headers(self, xrid: str) -> dict[str, str]:
        h = self.headers.copy()
        h["x-request-id"] = xrid
        return h

    def _target(self, url: str, path: str) -> _Target:
        t = self._targets.get((url, path))
        if t is None:
            t = self._targets[(url, path)] = _Target(url, path, self.headers)
        return t

    async def _send(
        self,
        url: str,
        path: str,
        body: bytes,
        xrid: str,
        bound_s: float,
        sent: Callable[[], None] | None = None,
    ) -> Response:
        """Send one leg request; ``bound_s`` bounds the exchange from now (the watchdog enforces
        it: no timer per leg). A reused keep-alive connection the engine closed meanwhile is
        replaced once (nothing of the request was processed: no response byte came back).
        ``sent`` is called once the request is written to a connection (before the head)."""
        target = self._target(url, path)
        extra: dict[str, str] | None = None
        if self.traced:
            with telemetry.client_span("POST", target.url) as extra:
                return await self._exchange(target, body, xrid, extra, bound_s, sent)
        return await self._exchange(target, body, xrid, extra, bound_s, sent)

    async def _exchange(
        self,
        target: _Target,
        body: bytes,
        xrid: str,
        extra: dict[str, str] | None,
        bound_s: float,
        sent: Callable[[], None] | None = None,
    ) -> Response:
        data = target.request(body, xrid, extra)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + bound_s if bound_s else 0.0
        for _ in range(2):
            conn = await self.pool.acquire(target.key, self._tls() if target.ssl else None)
            resp = conn.send(data, self.max_response_bytes)
            resp.deadline = deadline
            self._watched.add(resp)
            resp.on_close = self._watched.discard
            self._watching.set()
            if sent is not None:
                sent()
                sent = None
            try:
                await resp.head()
            except ConnectionLost:
                resp.close()
                if conn.reused and not resp.status:
                    continue
                raise
            except BaseException:
                resp.close()
                raise
            return resp
        raise ConnectionLost("engine closed the connection before the response")

    def _tls(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    # -- legs -------------------------------------------------------------------------------
    async def prefill(self, iid: str, url: str, path: str, body: bytes, xrid: str) -> dict[str, Any]:
        """Run the prefill leg; returns the KV descriptor or raises :class:`LegFailure`."""
        resp: Response | None = None
        try:
            resp = await self._send(url, path, body, xrid, self.prefill_timeout_s)
            raw = await resp.read()
            status = resp.status
            resp.release()
        except ResponseTooLarge as exc:
            raise LegFailure("response_limit", "prefill", iid, str(exc)) from None
        except (WireError, TimeoutError) as exc:
            if resp is not None:
                resp.close()
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

    async def open_decode(
        self, iid: str, url: str, path: str, body: bytes, xrid: str, first_token_s: float = 0.0
    ) -> DecodeStream:
        """Start the streamed decode leg; the caller must ``close()`` or ``release()`` the stream.

        ``first_token_s`` bounds the leg until the caller clears ``stream.resp.deadline`` (when the
        first token is in); a leg past it fails with ``LegFailure.deadline`` set.
        """
        try:
            resp = await self._send(url, path, body, xrid, first_token_s)
        except (WireError, TimeoutError) as exc:
            raise _classify(exc, "decode", iid) from None
        if resp.status != 200:
            try:
                async with asyncio.timeout(self.decode_read_timeout_s):
                    raw = await resp.read()
            except (WireError, TimeoutError):
                raw = b""
            finally:
                resp.close()
            raise _status_failure(resp.status, raw, "decode", iid)
        resp.last_rx = asyncio.get_running_loop().time()
        resp.idle_limit = self.decode_read_timeout_s
        return DecodeStream(resp, iid)

    async def decode_buffered(
        self,
        iid: str,
        url: str,
        path: str,
        body: bytes,
        xrid: str,
        head_s: float = 0.0,
        sent: Callable[[], None] | None = None,
    ) -> bytes:
        """Run a non-streamed decode leg; returns the engine's whole answer (status 200).

        The engine answers when it has generated everything: ``head_s`` (0: none but the
        caller's) bounds the wait for the response head, a leg past it fails with
        ``LegFailure.deadline`` set; from the head on, the body must keep coming:
        ``decode_read_timeout_s`` between body bytes (the watchdog), ``serving.max_response_bytes``
        in all. ``sent``: called once the request is on a connection to the engine (the answer's
        head comes only when everything is generated).
        """
        try:
            resp = await self._send(url, path, body, xrid, head_s, sent)
        except (WireError, TimeoutError) as exc:
            raise _classify(exc, "decode", iid) from None
        resp.deadline = 0.0
        resp.last_rx = asyncio.get_running_loop().time()
        resp.idle_limit = self.decode_read_timeout_s
        try:
            raw = await resp.read()
        except ResponseTooLarge as exc:
            resp.close()
            raise LegFailure("response_limit", "decode", iid, str(exc)) from None
        except (WireError, TimeoutError) as exc:
            resp.close()
            if isinstance(exc, TimeoutError):
                stalled = f"decode answer stalled: no body bytes for {self.decode_read_timeout_s}s"
                failure = LegFailure("stream", "decode", iid, stalled)
                failure.timed_out = True
            else:
                failure = _classify(exc, "decode", iid)
                failure.kind = "stream"
            raise failure from None
        except BaseException:
            resp.close()
            raise
        status = resp.status
        resp.release()
        if status != 200:
            raise _status_failure(status, raw, "decode", iid)
        return raw

    async def _watch_streams(self) -> None:
        """Fail legs past their deadline, and decode streams silent for ``decode_read_timeout_s``
        (unless the router itself paused reading them). One task for every leg, no timer per leg;
        with no leg in flight it waits for the next one instead of ticking (an idle router)."""
        eng = self.config.engine
        limit = min(self.decode_read_timeout_s, eng.first_token_timeout_s, self.prefill_timeout_s)
        tick = min(max(limit / 4, 0.02), 0.5)
        loop = asyncio.get_running_loop()
        while True:
            if not self._watched:
                self._watching.clear()
                await self._watching.wait()
            await asyncio.sleep(tick)
            now = loop.time()
            for resp in list(self._watched):
                if resp.conn.closed:
                    self._watched.discard(resp)
                elif resp.deadline and now > resp.deadline:
                    resp.fail(DeadlineExceeded("engine leg deadline passed"))
                elif resp.idle_limit and resp.conn.reading and now - resp.last_rx > resp.idle_limit:
                    resp.fail(TimeoutError("decode read timed out"))


class DecodeStream:
    """Server-sent events of one decode leg.

    ``next_events()`` yields every complete ``data:`` payload that has arrived (at least one), so a
    relay can forward a burst of frames with one write; ``next_data()`` yields them one by one.
    Events are split over the raw body chunks by :class:`SSEFramer` (CRLF, CR and LF line ends).
    ``resp`` is an engine :class:`Response` (or anything with ``content.readany()``, ``close()``,
    ``release()``); a streaming relay may take the stream over with ``resp.attach`` and keep
    feeding ``framer`` from the connection's callbacks.
    """

    __slots__ = ("framer", "iid", "resp")

    def __init__(self, resp: Any, iid: str) -> None:
        self.resp = resp
        self.iid = iid
        self.framer = SSEFramer()

    async def next_data(self) -> bytes | None:
        """The next data payload; None after ``[DONE]``. Raises LegFailure(stream) otherwise."""
        framer = self.framer
        if not framer.ready and not framer.done:
            await self._fill()
        if framer.ready:
            return framer.ready.pop(0)
        return None

    async def next_events(self) -> tuple[list[bytes], bool]:
        """(payloads, done): all complete payloads so far, waiting for at least one event.

        ``done`` is True once ``[DONE]`` was read (``payloads`` are the ones before it). Raises
        LegFailure(stream) when the stream fails or ends without ``[DONE]``.
        """
        if not self.framer.ready and not self.framer.done:
            await self._fill()
        return self.ready()

    def ready(self) -> tuple[list[bytes], bool]:
        """What ``next_events`` would return, without waiting (possibly ``([], False)``)."""
        return self.framer.take(), self.framer.done

    async def _fill(self) -> None:
        """Read until at least one payload (or [DONE]) is complete."""
        content = self.resp.content
        framer = self.framer
        try:
            while True:
                chunk = await content.readany()
                if not chunk:  # EOF: an unterminated last event still counts, like a readuntil()
                    framer.eof()
                    if framer.ready or framer.done:
                        return
                    raise LegFailure("stream", "decode", self.iid, "stream ended without [DONE]")
                if framer.feed(chunk) or framer.ready:
                    return
                if framer.oversized:
                    raise LegFailure("stream", "decode", self.iid, "stream event too large")
        except ResponseTooLarge as exc:
            raise LegFailure("response_limit", "decode", self.iid, str(exc)) from None
        except (
            aiohttp.ClientError,
            WireError,
            TimeoutError,
            asyncio.IncompleteReadError,
            ValueError,
        ) as exc:
            failure = _classify(exc, "decode", self.iid)
            failure.kind = "stream"
            if isinstance(exc, TimeoutError):
                failure.detail = "decode read timed out"
            raise failure from None

    def close(self) -> None:
        """Drop the connection (not back to the pool): the engine sees the client go away."""
        self.resp.close()

    def release(self) -> None:
        """After [DONE]: return the connection to the pool."""
        self.resp.release()
