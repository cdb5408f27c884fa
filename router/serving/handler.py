"""The completion routes: gate → admission → parse → PD attempts → relay → one terminal outcome.

Each attempt is a prefill leg on one engine and a streamed decode leg, on a different engine when
one is available. Attempts are retried (``serving.max_attempts``) only while no output has reached
the client. Resident counts on the scheduler track every leg precisely (try/finally).
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import TYPE_CHECKING, Protocol

import orjson
from aiohttp import web

from router.breaker import Breaker, Decision, FailureClass
from router.core import RouterCore
from router.counters import Outcome
from router.engines.legs import DecodeStream, EngineClient, LegFailure, decode_request, prefill_body
from router.metrics import ServingStats
from router.serving.admission import Admission, QueueExpired, QueueFull
from router.serving.errors import ClientError, error_body, error_doc, error_headers
from router.serving.exchange import AioExchange, BodyTooLarge, Exchange, StreamSink
from router.serving.outcome import RequestRecord, finish
from router.serving.parse import PATHS, Endpoint, ParsedRequest, parse_request
from router.serving.relay import StreamError, StreamState, has_output, relay_chunk
from router.serving.stream import BLOCKED, ClientGone, ClientRelay

if TYPE_CHECKING:
    from router.scheduler import EngineRuntime

log = logging.getLogger("narwhal.serving")
_SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache"}
_DONE = b"data: [DONE]\n\n"
_DISCONNECTS = (ConnectionResetError, ConnectionError)
# Request ids: 128 random bits as 32 hex digits (the shape of uuid4().hex, without its syscall).
_randbits = random.Random().getrandbits  # seeded from os.urandom once
_JSON_HEADERS = {"content-type": "application/json"}


def engine_request_id(client_rid: str | None, rid: str) -> str:
    """The ``x-request-id`` both engine legs get: the client's own (1-128 visible ASCII
    characters), else the router's id. The engine names its answer after it (``cmpl-<id>``)."""
    if client_rid and len(client_rid) <= 128 and client_rid.isascii() and client_rid.isprintable():
        if " " not in client_rid:
            return client_rid
    return rid


class DecisionSink(Protocol):
    def handle(self, decision: Decision) -> None: ...


class _Settled(Exception):
    """The request already has its terminal outcome and its response."""


class Serving:
    def __init__(
        self,
        core: RouterCore,
        engines: EngineClient,
        breaker: Breaker,
        stats: ServingStats,
        probes: DecisionSink | None = None,
        max_concurrent: int | None = None,
    ) -> None:
        self.core = core
        self.engines = engines
        self.breaker = breaker
        self.stats = stats
        self.probes = probes
        cfg = core.config
        self.model = cfg.model
        self.seats = max_concurrent or cfg.serving.max_connections
        srv = cfg.serving
        self.admission = Admission(
            stats, self.seats, srv.queue_capacity, srv.queue_timeout_s, srv.request_timeout_s
        )
        self._inflight_error = ClientError(
            429,
            f"too many requests in flight (limit {self.seats}"
            + (f" + {srv.queue_capacity} queued)" if srv.queue_capacity else ")"),
            "server_overloaded_error",
            "inflight_limit",
        )
        self.max_attempts = cfg.serving.max_attempts
        self.request_timeout = cfg.serving.request_timeout_s
        self.first_token_timeout = cfg.engine.first_token_timeout_s
        self.decode_read_timeout = cfg.engine.decode_read_timeout_s
        self.client_write_timeout = cfg.serving.client_write_timeout_s

    # -- component protocol -----------------------------------------------------------------
    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    # aiohttp's routes (what the client listener's own protocol, serving/front.py, hands to aiohttp)
    async def completions(self, request: web.Request) -> web.StreamResponse:
        ex = AioExchange(request)
        await self.handle(ex, "completions")
        return ex.result()

    async def chat(self, request: web.Request) -> web.StreamResponse:
        ex = AioExchange(request)
        await self.handle(ex, "chat")
        return ex.result()

    # -- request ----------------------------------------------------------------------------
    async def handle(self, ex: Exchange, endpoint: Endpoint) -> None:
        """One request, to its terminal outcome and its response on ``ex``."""
        core = self.core
        core.counters.offer()
        rec = RequestRecord(f"{_randbits(128):032x}", core.clock.monotonic())
        rec.client_rid = ex.client_rid
        if not core.ready():
            return self._not_ready(ex, rec)
        admission = self.admission
        if not admission.try_enter():
            try:
                waited = await admission.enter()
            except QueueFull:
                return self._settle(ex, rec, "rejected", "inflight_limit", self._inflight_error)
            except QueueExpired:
                if admission.queue_timeout:
                    msg = f"waited serving.queue_timeout_s ({admission.timeout}s) for an in-flight seat"
                    err = ClientError(504, msg, "queue_expired", "queue_timeout")
                    return self._settle(ex, rec, "expired", "queue_timeout", err)
                msg = f"request exceeded serving.request_timeout_s ({admission.timeout}s) in the queue"
                err = ClientError(504, msg, "request_expired", "deadline")
                return self._settle(ex, rec, "expired", "deadline", err)
            except asyncio.CancelledError:
                self._cancelled(rec)
                raise
            rec.extra = {"queue_wait_s": waited}
            if not core.ready():  # readiness changed while it waited
                admission.leave()
                return self._not_ready(ex, rec)
        try:
            await self._serve(ex, endpoint, rec)
        except _Settled:
            pass
        except asyncio.CancelledError:
            self._cancelled(rec)
            raise
        except _DISCONNECTS:
            self._cancelled(rec)
            ex.abandon()
        except Exception as exc:
            log.exception("request %s failed inside the router", rec.rid)
            if ex.sink is not None:  # output already reached the client: cut the stream
                finish(
                    self.core,
                    self.stats,
                    rec,
                    "failed",
                    "internal",
                    500,
                    f"internal router error: {type(exc).__name__}",
                )
                ex.sink.transport.abort()
                return
            self._settle(
                ex,
                rec,
                "failed",
                "internal",
                ClientError(
                    500, f"internal router error: {type(exc).__name__}", "internal_error", "internal"
                ),
            )
        finally:
            admission.leave()

    def _cancelled(self, rec: RequestRecord) -> None:
        rec.cancelled_phase = "decode" if rec.decode_iid else ("prefill" if rec.prefill_iid else "admission")
        expired = self.core.clock.monotonic() - rec.arrived >= self.request_timeout
        if expired:
            finish(self.core, self.stats, rec, "expired", "deadline", 499, "client left after the deadline")
        else:
            finish(self.core, self.stats, rec, "cancelled", "", 499, "client disconnected")

    def _settle(
        self, ex: Exchange, rec: RequestRecord, outcome: Outcome, reason: str, err: ClientError
    ) -> None:
        finish(self.core, self.stats, rec, outcome, reason, err.status, err.message, err.type, err.code)
        ex.respond(err.status, error_body(err), error_headers(err.status, rec.rid))

    def _not_ready(self, ex: Exchange, rec: RequestRecord, reason: str | None = None) -> None:
        core = self.core
        why = reason or core.ready_reason()
        if not core.controls_fleet() or core.scheduler.fleet_hold or reason:
            kind, message = "standby", "Router is not ready"
        elif not core.scheduler.eligible():
            kind, message = "no_schedulable_engines", "no engine can take new work"
        else:
            kind, message = "backend_unavailable", f"Router is not ready: {why}"
        rec.extra = {"readiness_reason": why}
        self._settle(ex, rec, "rejected", "not_ready", ClientError(503, message, kind, kind))

    async def _serve(self, ex: Exchange, endpoint: Endpoint, rec: RequestRecord) -> None:
        limit = self.core.config.serving.max_request_bytes
        if ex.content_length is not None and ex.content_length > limit:
            return self._too_large(ex, rec, limit)
        try:
            raw = await ex.read_body()
        except BodyTooLarge:
            return self._too_large(ex, rec, limit)
        try:
            parsed = parse_request(raw, endpoint, self.model, self.core.max_tokens_limit())
        except ClientError as err:
            return self._settle(ex, rec, "invalid_requests", err.code or "invalid_request", err)
        rec.stream = parsed.stream
        try:
            async with asyncio.timeout(self.request_timeout):
                return await self._attempts(ex, parsed, rec)
        except TimeoutError:
            msg = f"request exceeded serving.request_timeout_s ({self.request_timeout}s)"
            return await self._fail(ex, rec, "expired", "deadline", 504, msg, "request_expired", "deadline")

    def _too_large(self, ex: Exchange, rec: RequestRecord, limit: int) -> None:
        err = ClientError(
            413, f"request body exceeds {limit} bytes", "request_too_large", "request_too_large"
        )
        self._settle(ex, rec, "invalid_requests", "request_too_large", err)

    async def _attempts(self, ex: Exchange, parsed: ParsedRequest, rec: RequestRecord) -> None:
        sched = self.core.scheduler
        tried: list[str] = []
        for attempt in range(1, self.max_attempts + 1):
            rec.attempts = attempt
            hold = self.core.prefill_hold_reason()
            if hold:
                return self._not_ready(ex, rec, hold)
            p = sched.pick("prefill", exclude=tried) or sched.pick("prefill")
            if p is None:
                err = ClientError(
                    503, "no engine can take the prefill leg", "no_schedulable_engines", "no_engine"
                )
                return self._settle(ex, rec, "failed", "no_engine", err)
            try:
                return await self._attempt(ex, parsed, rec, attempt, p, tried)
            except LegFailure as f:
                self._evidence(f, rec.prefill_iid)
                rec.attempt_failures.append(f"{f.phase}:{f.iid}:{f.kind}")
                tried.append(f.iid)
                if rec.started or f.final or attempt == self.max_attempts:
                    type_ = "invalid_request_error" if f.client_fault else f.phase
                    return await self._fail(
                        ex, rec, "failed", f.reason, f.client_status, str(f), type_, f.reason
                    )
        raise AssertionError("unreachable")  # pragma: no cover

    def _evidence(self, f: LegFailure, producer: str | None) -> None:
        self.core.engine_stats.leg_failed(f.iid, f.phase, f.reason)
        if f.kind == "response_limit":  # the answer was too big for this router: not the engine's fault
            return
        if f.kind == "rejected":
            self.breaker.record_success(f.iid, "transport")
            return
        cls: FailureClass = f.kind  # type: ignore[assignment]
        decision = self.breaker.record_failure(
            f.iid, cls, producer=(producer or "") if f.phase == "decode" else ""
        )
        if decision.action != "none" and self.probes is not None:
            self.probes.handle(decision)

    async def _fail(
        self,
        ex: Exchange,
        rec: RequestRecord,
        outcome: Outcome,
        reason: str,
        status: int,
        message: str,
        type_: str,
        code: str,
    ) -> None:
        sink = ex.sink
        if not rec.started or sink is None:
            return self._settle(ex, rec, outcome, reason, ClientError(status, message, type_, code))
        # Output already reached the client: end the stream with an error event.
        finish(self.core, self.stats, rec, outcome, reason, 200, message, type_, code)
        try:
            await sink.write_eof(b"data: " + orjson.dumps(error_doc(message, type_, code)) + b"\n\n")
        except _DISCONNECTS:
            pass

    async def _attempt(
        self,
        ex: Exchange,
        parsed: ParsedRequest,
        rec: RequestRecord,
        attempt: int,
        p: EngineRuntime,
        tried: list[str],
    ) -> None:
        sched, engines, body = self.core.scheduler, self.engines, parsed.body
        path = PATHS[parsed.endpoint]
        # Both legs carry the request's id (the client's, or the router's); a retry adds -a<n>, a
        # decode on the producer itself -d, so an engine never sees one id twice.
        xrid = rec.engine_rid or engine_request_id(rec.client_rid, rec.rid)
        rec.engine_rid = xrid
        if attempt > 1:
            xrid = f"{xrid}-a{attempt}"
        rec.prefill_iid, rec.decode_iid = p.iid, None
        p.resident_prefill += 1
        opened = self.core.clock.monotonic()
        try:
            desc = await engines.prefill(p.iid, p.url, path, prefill_body(body, self.model), xrid)
        finally:
            p.resident_prefill -= 1
        self.breaker.record_success(p.iid, "prefill")
        rec.decode_opened_at = self.core.clock.monotonic()
        self.core.engine_stats.prefill_served(p.iid, rec.decode_opened_at - opened)
        d = (
            sched.pick("decode", exclude=(p.iid, *tried))
            or sched.pick("decode", exclude=tried)
            or sched.pick("decode")
        )
        if d is None:
            if self.core.prefill_hold_reason() or not self.core.ready():
                self._not_ready(ex, rec)
                raise _Settled
            err = ClientError(503, "no engine can take the decode leg", "no_schedulable_engines", "no_engine")
            self._settle(ex, rec, "failed", "no_engine", err)
            raise _Settled
        rec.decode_iid = d.iid
        same = d.iid == p.iid
        dbody = decode_request(parsed.raw, body, self.model, None if same else desc, parsed.model_given)
        dxrid = xrid + "-d" if same else xrid
        d.resident_decode += 1
        d.opening_decode += 1  # until the engine has answered the leg (active-active acknowledgement)
        if not parsed.stream:
            try:
                await self._buffered(ex, d, path, dbody, dxrid, parsed, rec)
            finally:
                d.resident_decode -= 1
            return
        stream = None
        clean = False
        st = StreamState()
        want = parsed.want_token_ids
        frames: list[bytes] = []
        try:
            try:
                # first_token_timeout_s bounds the leg until the first token (the engine client's
                # watchdog enforces it: no timer per request)
                try:
                    stream = await engines.open_decode(
                        d.iid, d.url, path, dbody, dxrid, self.first_token_timeout
                    )
                finally:
                    d.opening_decode -= 1
                while True:
                    payload = await stream.next_data()
                    if payload is None:
                        raise LegFailure("stream", "decode", d.iid, "[DONE] before any output")
                    out, n = relay_chunk(payload, st, want)
                    frames += (b"data: ", out, b"\n\n")
                    if n:
                        break
                stream.resp.deadline = 0.0
            except LegFailure as f:
                if not f.deadline:
                    raise
                self.core.demand_risk.record("first_token_timeout")  # HA: consolidation risk (spec §9.3)
                f = LegFailure(
                    "stream", "decode", d.iid, f"no first token within {self.first_token_timeout}s"
                )
                f.timed_out = True
                raise f from None
            except StreamError as exc:
                raise LegFailure("stream", "decode", d.iid, str(exc)) from None
            rec.first_token_at = self.core.clock.monotonic()
            await self._relay(ex, stream, st, parsed, rec, frames)
            clean = True
            self.breaker.record_success(d.iid, "decode")
        finally:
            d.resident_decode -= 1
            if stream is not None:
                if clean:
                    stream.release()
                else:
                    stream.close()  # drop the connection: the engine sees the client leave

    async def _buffered(
        self,
        ex: Exchange,
        d: EngineRuntime,
        path: str,
        dbody: bytes,
        xrid: str,
        parsed: ParsedRequest,
        rec: RequestRecord,
    ) -> None:
        """Buffered client: the decode leg answers one document, and that document — the engine's
        own bytes — is the client's answer. Nothing reached the client before it, so a failed leg
        is retried like a prefill. Its first output is the whole answer (``first_token_at``).

        The wait for the answer's head is bounded by what a streamed leg of the same request could
        take without being cut (``buffered_head_bound``); past it the leg fails like a missing
        first token."""
        bound = buffered_head_bound(parsed.body, self.first_token_timeout, self.decode_read_timeout)
        opening = [True]

        def sent() -> None:
            # The engine answers when it is done: the leg stops "opening" (active-active drain
            # acknowledgement) once it is on the engine's connection; resident_decode still counts it.
            if opening[0]:
                opening[0] = False
                d.opening_decode -= 1

        try:
            raw = await self.engines.decode_buffered(d.iid, d.url, path, dbody, xrid, bound, sent)
        except LegFailure as f:
            if not f.deadline:
                raise
            self.core.demand_risk.record("first_token_timeout")  # HA: consolidation risk (spec §9.3)
            f = LegFailure("stream", "decode", d.iid, f"no answer within {bound:g}s")
            f.timed_out = True
            raise f from None
        finally:
            sent()
        rec.output_len = _answer_tokens(raw, d.iid)
        rec.first_token_at = self.core.clock.monotonic()
        self.breaker.record_success(d.iid, "decode")
        finish(self.core, self.stats, rec, "served")
        ex.respond(200, raw, {**_JSON_HEADERS, "x-request-id": rec.rid})

    async def _relay(
        self,
        ex: Exchange,
        stream: DecodeStream,
        st: StreamState,
        parsed: ParsedRequest,
        rec: RequestRecord,
        frames: list[bytes],
    ) -> None:
        """Streaming client: relay SSE frames as they arrive; from here on no retry is possible.

        What is in hand (the first token's frames and any that arrived with them) goes out with the
        response head in one write; then the engine connection's callbacks relay the rest
        (``serving/stream.py``) while this task waits for the end, a failure or back-pressure.
        """
        sink = await ex.open_stream({**_SSE_HEADERS, "x-request-id": rec.rid})
        rec.started = True
        want = parsed.want_token_ids
        payloads, done = stream.ready()
        try:
            for payload in payloads:
                try:
                    out, _ = relay_chunk(payload, st, want)
                except StreamError:
                    if frames:  # relay the good frames before the bad one, as they came
                        await sink.write(b"".join(frames))
                    raise
                frames += (b"data: ", out, b"\n\n")
        except StreamError as exc:
            rec.output_len = st.tokens
            raise LegFailure("stream", "decode", stream.iid, str(exc)) from None
        rec.input_len = st.prompt_tokens  # the first chunk's prompt_token_ids, counted on bytes
        if done:
            frames.append(_DONE)
        else:
            await sink.write(b"".join(frames))
            relay = ClientRelay(stream, sink.transport, sink.flow, sink.chunked, st, want)
            relay.start()
            try:
                while await relay.signal == BLOCKED:
                    try:
                        async with asyncio.timeout(self.client_write_timeout):
                            await sink.drain()
                    except TimeoutError:
                        rec.output_len = st.tokens
                        self._slow_client(rec, sink)
                        raise _Settled from None
                    relay.rearm()
            except ClientGone:
                raise ConnectionResetError("client disconnected") from None
            finally:
                relay.detach()
                rec.output_len = st.tokens
            frames = relay.tail
        rec.output_len = st.tokens
        # The last frames, [DONE] and the end of the chunked body: one write.
        await sink.write_eof(b"".join(frames))
        finish(self.core, self.stats, rec, "served")

    def _slow_client(self, rec: RequestRecord, sink: StreamSink) -> None:
        """The client did not take the stream's bytes within client_write_timeout_s: cut it."""
        rec.cancelled_phase = "decode"
        msg = f"client did not read the stream within serving.client_write_timeout_s ({self.client_write_timeout}s)"
        finish(self.core, self.stats, rec, "cancelled", "slow_client", 499, msg)
        sink.transport.abort()  # its unread bytes are dropped; the engine leg is closed by the caller


def buffered_head_bound(body: dict[str, object], first_token_s: float, read_s: float) -> float:
    """How long a buffered decode leg may take to answer: the longest a streamed leg of the same
    request runs without being cut — the first token within ``first_token_s``, then every step
    within ``read_s`` — ``first_token_s + (max_tokens - 1) * read_s``. 0 (no bound but
    ``serving.request_timeout_s``) when the request does not bound its tokens."""
    mt = body.get("max_completion_tokens") or body.get("max_tokens")
    if type(mt) is not int or mt < 1:
        return 0.0
    return first_token_s + (mt - 1) * read_s


def _answer_tokens(raw: bytes, iid: str) -> int:
    """The generated tokens of a buffered decode answer (``usage.completion_tokens``, else one per
    choice with output); a document that is not an answer, or holds no output, fails the leg."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise LegFailure("stream", "decode", iid, "decode answer is not JSON") from None
    choices = doc.get("choices") if type(doc) is dict else None
    if type(choices) is not list:
        raise LegFailure("stream", "decode", iid, "decode answer has no choices")
    usage = doc.get("usage")
    n = usage.get("completion_tokens") if type(usage) is dict else None
    if not n and not any(type(c) is dict and has_output(c) for c in choices):
        raise LegFailure("stream", "decode", iid, "decode answer holds no output")
    return n if type(n) is int else len(choices)
