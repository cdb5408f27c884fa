"""The connection guard on a listener aiohttp serves (the control listener's kind) and the graceful
stop's refusal of new connections, through ``connections.Listeners`` (our own sockets)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from aiohttp import web

from router.config import ServingSettings
from router.connections import MIN_BOUND, ConnectionGuard, Listeners
from router.serving.exchange import AioExchange
from tests.unit.test_front import Client, front_server, post, until


@dataclass
class Aio:
    port: int
    guard: ConnectionGuard
    runner: web.AppRunner
    gate: asyncio.Event

    async def connect(self) -> Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        return Client(reader, writer)


@contextlib.asynccontextmanager
async def aiohttp_listener() -> AsyncIterator[Aio]:
    app = web.Application()
    gate = asyncio.Event()
    gate.set()

    async def health(_: web.Request) -> web.Response:
        await gate.wait()
        return web.json_response({"ok": True})

    app.router.add_post("/health", health)
    guard = ConnectionGuard(ServingSettings(max_client_connections=MIN_BOUND, header_timeout_s=10.0))
    listening = Listeners(guard, 10.0)
    listening.install(app)
    runner = web.AppRunner(app, shutdown_timeout=10.0, **guard.runner_kwargs())
    await runner.setup()
    assert runner.server is not None
    port = await listening.open(runner.server, "127.0.0.1", 0)
    try:
        yield Aio(port, guard, runner, gate)
    finally:
        if runner.server is not None:
            await runner.cleanup()


HEALTH = post(b"{}", b"/health")


async def test_the_header_timeout_closes_a_silent_aiohttp_connection_and_spares_one_that_sent_a_request() -> (
    None
):
    async with aiohttp_listener() as s:
        silent = await s.connect()
        served = await s.connect()
        served.send(HEALTH)
        assert (await served.response())[0].status_code == 200
        await until(lambda: s.guard.open_connections() == 2, "both connections counted")
        loop = asyncio.get_running_loop()
        assert s.guard.sweep_once(loop.time() + 60) == 1
        assert await silent.eof() == b""
        assert s.guard.header_timeouts == 1
        served.send(HEALTH)
        assert (await served.response())[0].status_code == 200
        served.close()


async def test_one_connection_over_the_bound_is_closed_at_accept_and_counted() -> None:
    async with aiohttp_listener() as s:
        held = [await s.connect() for _ in range(s.guard.bound)]
        await until(lambda: s.guard.open_connections() == s.guard.bound, "the bound's connections are open")
        extra = await s.connect()
        with contextlib.suppress(ConnectionResetError):
            assert await extra.eof() == b""
        assert s.guard.refused == 1
        held.pop().close()
        await until(lambda: s.guard.open_connections() == s.guard.bound - 1, "one closed")
        again = await s.connect()
        again.send(HEALTH)
        assert (await again.response())[0].status_code == 200
        for c in [*held, again]:
            c.close()


async def test_the_stop_refuses_new_connections_closes_idle_ones_and_finishes_the_request() -> None:
    async with aiohttp_listener() as s:
        idle = await s.connect()
        idle.send(HEALTH)
        await idle.response()
        s.gate.clear()
        busy = await s.connect()
        busy.send(HEALTH)
        await until(lambda: s.guard.open_connections() == 2, "both connections counted")
        stopping = asyncio.create_task(s.runner.cleanup())
        assert await idle.eof() == b""
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", s.port)
        s.gate.set()
        resp, body = await busy.response()
        assert resp.status_code == 200 and json.loads(body) == {"ok": True}
        await stopping


async def test_the_stop_refuses_new_connections_on_the_front_listener() -> None:
    async with front_server() as s:
        s.serving.gate = asyncio.Event()
        busy = await s.connect()
        busy.send(post(b'{"last":1}'))
        await s.serving.entered.wait()
        idle = await s.connect()
        await until(lambda: s.guard.open_connections() == 2, "both connections counted")
        stopping = asyncio.create_task(s.runner.cleanup())
        assert await idle.eof() == b""
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", s.port)
        s.serving.gate.set()
        resp, body = await busy.response()
        assert resp.status_code == 200 and json.loads(body) == {"echo": {"last": 1}}
        await stopping
        assert s.serving.cancelled == 0


# -- a stream served through aiohttp: the relay's own transport writes, framed as the response is --
async def _relayed_stream(request: web.Request) -> web.StreamResponse:
    ex = AioExchange(request)
    sink = await ex.open_stream({"content-type": "text/event-stream"})
    await sink.write(b"data: 1\n\n")  # the head goes out with the first write
    relayed = b"data: 2\n\n"  # what ClientRelay writes straight to the transport
    sink.transport.write(b"%x\r\n%b\r\n" % (len(relayed), relayed) if sink.chunked else relayed)
    assert sink.flow.writing_paused is False
    await sink.drain()
    await sink.write_eof(b"data: [DONE]\n\n")
    return ex.result()


@pytest.mark.parametrize(("version", "chunked"), [(b"1.1", True), (b"1.0", False)])
async def test_the_relays_transport_writes_under_an_aiohttp_stream_are_framed_as_the_response(
    version: bytes, chunked: bool
) -> None:
    app = web.Application()
    app.router.add_post("/v1/completions", _relayed_stream)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v1/completions HTTP/%b\r\nHost: r\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
            % version
        )
        async with asyncio.timeout(20):
            raw = await reader.read()  # the server closes after the stream (Connection: close)
        writer.close()
    finally:
        await runner.cleanup()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.") and b" 200 " in head.split(b"\r\n", 1)[0]
    assert (b"transfer-encoding: chunked" in head.lower()) is chunked
    events = b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
    if chunked:
        parsed = b""
        while True:
            size_line, _, body = body.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            parsed, body = parsed + body[:size], body[size + 2 :]
        assert parsed == events
    else:
        assert body == events
