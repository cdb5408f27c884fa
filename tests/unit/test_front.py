"""The client listener's own protocol (router/serving/front.py) over real loopback sockets.

A fake ``Serving`` answers the completion routes; aiohttp's app has ``/health`` and its own
``/v1/completions`` (answering ``"via": "aiohttp"``), so every test can tell which server answered.
Responses are parsed with h11, which refuses any framing error in what the front writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import h11
import pytest
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, BadStatusLine

from router.config import ServingSettings
from router.connections import ConnectionGuard, Listeners
from router.serving.exchange import BodyTooLarge, Exchange
from router.serving.front import FrontServer, MalformedHeadLog
from router.serving.head import DELEGATE, MAX_HEAD, Head, response_head, scan
from router.serving.parse import Endpoint

MAX_BODY = 1024


class FakeServing:
    def __init__(self) -> None:
        self.calls: list[tuple[Endpoint, str | None, bytes]] = []
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()
        self.cancelled = 0

    async def handle(self, ex: Exchange, endpoint: Endpoint) -> None:
        try:
            body = await ex.read_body()
        except BodyTooLarge:
            self.calls.append((endpoint, ex.client_rid, b""))
            ex.respond(413, b'{"error":"too large"}', {"content-type": "application/json"})
            return
        self.calls.append((endpoint, ex.client_rid, body))
        self.entered.set()
        if self.gate is not None:
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if json.loads(body).get("stream"):
            sink = await ex.open_stream({"content-type": "text/event-stream"})
            await sink.write(b"data: 1\n\n")
            await sink.write(b"")  # an empty write is no chunk (it would end the body)
            await sink.write_eof(b"data: [DONE]\n\n")
        else:
            ex.respond(200, b'{"echo":' + body + b"}", {"content-type": "application/json"})


@dataclass
class Served:
    port: int
    front: FrontServer
    guard: ConnectionGuard
    runner: web.AppRunner
    serving: FakeServing

    async def connect(self) -> Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        return Client(reader, writer)


@contextlib.asynccontextmanager
async def front_server(idle: float = 15.0, header_timeout: float = 10.0) -> AsyncIterator[Served]:
    app = web.Application(client_max_size=MAX_BODY)

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def aio_completions(request: web.Request) -> web.Response:
        return web.json_response({"via": "aiohttp", "body": (await request.read()).decode()})

    app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", aio_completions)
    settings = ServingSettings(idle_timeout_s=idle, header_timeout_s=header_timeout)
    guard = ConnectionGuard(settings)
    listening = Listeners(guard, 10.0)
    listening.install(app)  # the header-timeout middleware and the graceful stop in runner.cleanup()
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=10.0, **guard.runner_kwargs())
    await runner.setup()
    serving = FakeServing()
    assert runner.server is not None
    front = FrontServer(serving, runner.server, idle_timeout=idle, max_body=MAX_BODY, guard=guard)
    port = await listening.open(runner.server, "127.0.0.1", 0, front=front)
    try:
        yield Served(port, front, guard, runner, serving)
    finally:
        if runner.server is not None:  # not stopped by the test itself
            await runner.cleanup()


class Client:
    """Raw bytes out; h11 reads the responses (pipelined ones in order)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.CLIENT)

    def send(self, *requests: bytes) -> None:
        self.writer.write(b"".join(requests))

    async def response(self) -> tuple[h11.Response, bytes]:
        conn = self.h11
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
        conn.send(h11.Request(method="POST", target="/", headers=[("host", "x"), ("content-length", "0")]))
        conn.send(h11.EndOfMessage())
        head: h11.Response | None = None
        body = b""
        async with asyncio.timeout(20):
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await self.reader.read(65536))
                elif isinstance(event, h11.Response):
                    head = event
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    assert head is not None
                    return head, body
                else:
                    raise AssertionError(f"unexpected {event!r}")

    async def eof(self) -> bytes:
        """What is left before the server closes the connection."""
        async with asyncio.timeout(20):
            return await self.reader.read()

    def close(self) -> None:
        self.writer.close()


def post(body: bytes, target: bytes = b"/v1/completions", extra: bytes = b"") -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s"
        % (target, extra, len(body), body)
    )


def header(response: h11.Response, name: bytes) -> bytes | None:
    return next((v for k, v in response.headers if k == name), None)


async def until(predicate: object, what: str) -> None:
    async with asyncio.timeout(20):
        while not predicate():  # type: ignore[operator]  # noqa: ASYNC110 - state owned by the server
            await asyncio.sleep(0.01)


# -- scan: which heads the front serves itself -----------------------------------------------------
VALID = b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nX-Request-Id: abc\r\nContent-Length: 12\r\n\r\n"


def test_scan_reads_a_plain_completion_head() -> None:
    assert scan(VALID + b'{"prompt":1}') == Head("completions", len(VALID), 12, True, "abc")
    chat = VALID.replace(b"/v1/completions", b"/v1/chat/completions").replace(
        b"Host", b"connection: close\r\nHost"
    )
    assert scan(chat) == Head("chat", len(chat), 12, False, "abc")


def test_scan_waits_for_the_whole_head_at_every_cut() -> None:
    for cut in range(len(VALID)):
        assert scan(VALID[:cut]) is None, cut


@pytest.mark.parametrize(
    "head",
    [
        b"GET /health HTTP/1.1\r\n\r\n",
        b"POST /v1/models HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        b"POST /v1/completions?x=1 HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        b"POST /v1/completionsX HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        b"POST /v1/completions HTTP/1.0\r\nContent-Length: 0\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: 3\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost: r\r\n\r\n",  # no Content-Length
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: -3\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: 3\r\nBad Name: x\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: 3\r\nX-A: 1\r\n folded\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: 3\nHost: r\r\n\r\n",  # a bare LF
        b"POST /v1/completions HTTP/1.1\nHost: r\nContent-Length: 3\n\n",  # bare LFs only
        b"POST /v1/completions HTTP/1.1\n",  # not finished, but no CRLF head can follow a bare LF
        b"POST /v1/completions HTTP/1.1\r\nHost: r\n",
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: 3\r\nX-A: a\x00b\r\n\r\n",
        b"POST  /v1/completions HTTP/1.1\r\nContent-Length: 3\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nX-Big: " + b"a" * MAX_HEAD + b"\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nX-Big: " + b"a" * MAX_HEAD,  # over the limit, unfinished
    ],
)
def test_scan_hands_everything_else_to_aiohttp(head: bytes) -> None:
    assert scan(head) == DELEGATE


def test_response_head_frames_length_or_chunks_and_says_close() -> None:
    whole = response_head(429, {"content-type": "application/json"}, 7, keep_alive=False)
    assert whole.startswith(b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n")
    assert b"content-length: 7\r\n" in whole and b"connection: close\r\n" in whole
    assert b"\r\ndate: " in whole and whole.endswith(b"\r\n\r\n")
    streamed = response_head(200, {}, None, keep_alive=True)
    assert b"transfer-encoding: chunked\r\n" in streamed and b"connection" not in streamed


# -- the protocol over real sockets ------------------------------------------------------------------
async def test_keep_alive_requests_are_served_by_the_front() -> None:
    async with front_server() as s:
        c = await s.connect()
        for n in range(3):
            c.send(post(b'{"n":%d}' % n, extra=b"X-Request-Id: r%d\r\n" % n))
            resp, body = await c.response()
            assert resp.status_code == 200 and json.loads(body) == {"echo": {"n": n}}
            assert header(resp, b"content-length") == str(len(body)).encode()
            assert header(resp, b"date") is not None
        assert [(e, rid) for e, rid, _ in s.serving.calls] == [("completions", f"r{n}") for n in range(3)]
        assert s.front.delegated == 0
        c.close()


async def test_a_streamed_response_is_chunked_and_ends_cleanly() -> None:
    async with front_server() as s:
        c = await s.connect()
        c.send(post(b'{"stream":true}', b"/v1/chat/completions"))
        resp, body = await c.response()
        assert resp.status_code == 200 and header(resp, b"transfer-encoding") == b"chunked"
        assert body == b"data: 1\n\ndata: [DONE]\n\n"
        c.send(post(b"{}"))  # the connection is reusable after the last chunk
        assert (await c.response())[1] == b'{"echo":{}}'
        assert s.serving.calls[0][0] == "chat"
        c.close()


async def test_pipelined_requests_are_answered_in_order_across_the_handoff_to_aiohttp() -> None:
    async with front_server() as s:
        s.serving.gate = asyncio.Event()
        c = await s.connect()
        c.send(post(b'{"a":1}'), b"GET /health HTTP/1.1\r\nHost: r\r\n\r\n", post(b'{"b":2}'))
        await s.serving.entered.wait()
        await asyncio.sleep(0.05)  # the pipelined bytes arrive while the first request is served
        assert s.front.delegated == 0  # nothing is handed over before the first answer is out
        s.serving.gate.set()
        first, second, third = [await c.response() for _ in range(3)]
        assert json.loads(first[1]) == {"echo": {"a": 1}}
        assert json.loads(second[1]) == {"ok": True}
        # from the handoff on the connection is aiohttp's, completions included
        assert json.loads(third[1]) == {"via": "aiohttp", "body": '{"b":2}'}
        assert s.front.delegated == 1 and len(s.serving.calls) == 1
        c.close()


async def test_a_chunked_completion_request_is_served_by_aiohttp() -> None:
    async with front_server() as s:
        c = await s.connect()
        c.send(
            b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{}\n\r\n0\r\n\r\n"
        )
        resp, body = await c.response()
        assert resp.status_code == 200 and json.loads(body) == {"via": "aiohttp", "body": "{}\n"}
        assert s.serving.calls == [] and s.front.delegated == 1
        c.close()


async def test_a_malformed_head_gets_aiohttps_400() -> None:
    async with front_server() as s:
        c = await s.connect()
        c.send(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd")
        resp, _ = await c.response()
        assert resp.status_code == 400 and s.serving.calls == []
        c.close()


async def test_connection_close_is_answered_and_honoured() -> None:
    async with front_server() as s:
        c = await s.connect()
        c.send(post(b"{}", extra=b"Connection: close\r\n"))
        resp, _ = await c.response()
        assert resp.status_code == 200 and header(resp, b"connection") == b"close"
        assert await c.eof() == b""


async def test_a_body_over_the_limit_is_refused_and_read_before_the_connection_closes() -> None:
    async with front_server() as s:
        c = await s.connect()
        request = post(b'"' + b"x" * (MAX_BODY * 4) + b'"')
        c.send(request[:200])  # the head and the start of the body: the answer comes before the rest
        resp, body = await c.response()
        assert resp.status_code == 413 and b"too large" in body
        assert header(resp, b"connection") == b"close"
        assert s.guard.open_connections() == 1  # kept open while the client still sends its body
        c.send(request[200:])
        assert await c.eof() == b""  # closed once the body was read: no reset under the answer
        await until(lambda: s.guard.open_connections() == 0, "closed")


async def test_an_idle_connection_is_closed_after_the_idle_timeout() -> None:
    async with front_server(idle=0.3) as s:
        c = await s.connect()
        c.send(post(b"{}"))
        await c.response()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert await c.eof() == b""
        assert loop.time() - t0 >= 0.25  # not before the timeout (the timer is the loop's)
        partial = await s.connect()
        partial.send(post(b'{"a":')[:-3])  # a body that stops arriving
        assert await partial.eof() == b""
        assert s.serving.calls[1:] == []


async def test_the_client_leaving_cancels_its_request() -> None:
    async with front_server() as s:
        s.serving.gate = asyncio.Event()
        c = await s.connect()
        c.send(post(b"{}"))
        await s.serving.entered.wait()
        c.close()
        await until(lambda: s.serving.cancelled == 1, "the handler was cancelled")
        await until(lambda: s.guard.open_connections() == 0, "the connection is gone")


async def test_connections_count_against_the_bound_and_the_header_timeout_closes_silent_ones() -> None:
    async with front_server() as s:
        silent = await s.connect()
        served = await s.connect()
        served.send(post(b"{}"))
        await served.response()
        handed = await s.connect()
        handed.send(b"GET /hea")  # an unfinished head on its way to aiohttp
        await until(lambda: s.front.delegated == 1, "handed to aiohttp")
        assert s.guard.open_connections() == 3
        loop = asyncio.get_running_loop()
        assert s.guard.sweep_once(loop.time() + 60) == 2  # the silent one and the unfinished head
        assert await silent.eof() == b"" and await handed.eof() == b""
        served.send(post(b"{}"))  # a connection that delivered a request is not touched
        assert (await served.response())[0].status_code == 200
        served.close()


async def test_the_graceful_stop_finishes_the_request_in_progress_and_closes_idle_connections() -> None:
    async with front_server() as s:
        s.serving.gate = asyncio.Event()
        idle = await s.connect()
        idle.send(post(b"{}"))
        s.serving.gate.set()
        await idle.response()
        s.serving.gate.clear()
        s.serving.entered.clear()
        busy = await s.connect()
        busy.send(post(b'{"last":1}'))
        await s.serving.entered.wait()
        stopping = asyncio.create_task(s.runner.cleanup())
        assert await idle.eof() == b""  # closed at once: nothing in progress
        assert not stopping.done()
        s.serving.gate.set()
        resp, body = await busy.response()
        assert resp.status_code == 200 and json.loads(body) == {"echo": {"last": 1}}
        assert header(resp, b"connection") == b"close"
        await stopping
        assert s.serving.cancelled == 0


def _server_record(level: int, exc: BaseException) -> logging.LogRecord:
    return logging.LogRecord(
        "aiohttp.server",
        level,
        __file__,
        1,
        "Error handling request from %s",
        ("10.0.0.7",),
        (type(exc), exc, None),
    )


def test_a_malformed_head_is_one_info_line_and_other_errors_pass(caplog: pytest.LogCaptureFixture) -> None:
    f = MalformedHeadLog()
    caplog.set_level(logging.INFO, "narwhal.front")
    bad = BadStatusLine(
        b"GET /health HTTP/1.1\nHost: x\n\n", "Bad status line:\n  Expected CRLF after version:\n\n  b'GET'"
    )
    assert f.filter(_server_record(logging.ERROR, bad)) is False
    assert (
        f.filter(_server_record(logging.ERROR, BadHttpMessage("Missing expected CR after header value")))
        is False
    )
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        (
            "INFO",
            "malformed request from 10.0.0.7 answered 400: Bad status line: Expected CRLF after version",
        ),
        ("INFO", "malformed request from 10.0.0.7 answered 400: Missing expected CR after header value"),
    ]
    caplog.clear()
    assert f.filter(_server_record(logging.ERROR, RuntimeError("a bug"))) is True  # a real error stays
    assert f.filter(_server_record(logging.DEBUG, bad)) is True  # aiohttp's own DEBUG choice stays
    assert caplog.records == []
