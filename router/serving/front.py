"""The client listener's own HTTP/1.1 protocol for the completion routes.

aiohttp's server costs, per request, a request object with its header multidict, a route match, a
payload stream, a response object and its head serialiser — ~15 % of the router's CPU under load
(``docs/benchmarks.md`` §0). On the client listener each connection starts with a
:class:`FrontProtocol` instead: a request head that ``serving/head.py`` recognises as a plain
``POST /v1/completions`` or ``POST /v1/chat/completions`` is read here (head and whole body) and
served by ``Serving.handle`` through a :class:`FrontExchange` (one prebuilt response head, written
with the first bytes of the body). Anything else — ``/health``, ``/metrics``, ``/narwhal/*``, a
chunked or malformed request — is handed, unread, to aiohttp: the connection's transport is given
to a new aiohttp ``RequestHandler`` with the bytes received so far, and stays aiohttp's to its end.
aiohttp answers a malformed head 400; :class:`MalformedHeadLog` makes its log of it one INFO line.

What it keeps from aiohttp's server, so the listener behaves the same:

- keep-alive and pipelining (a request that arrives while one is served waits in the buffer; reading
  pauses when that buffer is over a body and a head);
- ``TCP_NODELAY``; the client leaving cancels the request's task (``handler_cancellation``);
- ``serving.idle_timeout_s`` for a connection between requests, and for a request that stopped
  arriving (a head that never completes counts from the end of the previous response, a body from
  its last bytes);
- the connection bound, the header timeout and the graceful stop: :class:`FrontServer` keeps its
  open connections (``ConnectionGuard`` counts them with aiohttp's ``web.Server.connections``), tells
  the guard when a connection's first head arrived, and ``connections.Listeners`` closes them when
  idle (:meth:`FrontServer.close`) and waits up to ``serving.graceful_timeout_s`` for their requests
  (:meth:`FrontServer.shutdown`) during ``AppRunner.cleanup``.

The hand-off uses only public API: the protocol that calling aiohttp's ``web.Server`` returns gets
the transport (``transport.set_protocol``) and, through the ``asyncio.Protocol`` methods, the
connection and the bytes read so far.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from router.connections import ConnectionGuard
from router.serving.exchange import BodyTooLarge, Paused
from router.serving.head import DELEGATE, MAX_HEAD, Head, response_head, scan
from router.serving.parse import Endpoint

if TYPE_CHECKING:
    from router.serving.exchange import Exchange

log = logging.getLogger("narwhal.front")
_LAST_CHUNK = b"0\r\n\r\n"
LINGER_S = 10.0  # aiohttp's lingering_time: how long an unread body over the limit is read and dropped


class MalformedHeadLog(logging.Filter):
    """On aiohttp's server logger: a request aiohttp could not parse (a malformed head — the
    client's fault, answered 400) is logged by aiohttp as an ERROR with a traceback, one per head.
    This turns each into one INFO line of ours saying who sent it and what was wrong; every other
    record passes as it is (aiohttp's DEBUG line for non-HTTP bytes on a first request stays DEBUG)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if record.levelno < logging.ERROR or not isinstance(exc, HttpProcessingError):
            return True
        peer = record.args[0] if isinstance(record.args, tuple) and record.args else "a client"
        lines = []
        for line in exc.message.splitlines():  # "Bad status line:\n  Expected CRLF …:\n\n  b'…'"
            if not line.strip():
                break
            lines.append(line.strip())
        what = " ".join(lines).rstrip(":") or type(exc).__name__
        log.info("malformed request from %s answered %d: %s", peer, exc.code, what)
        return False


def install_malformed_head_log() -> None:
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, MalformedHeadLog) for f in server_log.filters):
        server_log.addFilter(MalformedHeadLog())


class Handles(Protocol):
    async def handle(self, ex: Exchange, endpoint: Endpoint) -> None: ...


class FrontServer:
    """Makes one :class:`FrontProtocol` per accepted connection (the client site's factory)."""

    def __init__(
        self,
        serving: Handles,
        server: web.Server,
        *,
        idle_timeout: float,
        max_body: int,
        guard: ConnectionGuard | None = None,
    ) -> None:
        self.serving = serving
        self.server = server
        self.idle_timeout = idle_timeout
        self.max_body = max_body
        self.guard = guard
        self.connections: set[FrontProtocol] = set()  # open, not handed to aiohttp
        self.delegated = 0  # connections handed to aiohttp (tests, debugging)

    def __call__(self) -> FrontProtocol:
        return FrontProtocol(self)

    def __len__(self) -> int:
        return len(self.connections)

    def close(self) -> None:
        """The stop: idle connections close now, the others after their response."""
        for conn in list(self.connections):
            conn.close()

    async def shutdown(self, timeout: float) -> None:  # noqa: ASYNC109 (the stop's grace)
        """Wait up to ``timeout`` for the requests in progress (cancelled after it), then close."""
        await asyncio.gather(*(conn.shutdown(timeout) for conn in list(self.connections)))


class _Sink:
    """The SSE body of one front response: HTTP chunks straight to the transport."""

    __slots__ = ("_head", "chunked", "ex", "flow", "transport")

    def __init__(self, ex: FrontExchange, transport: asyncio.Transport, head: bytes) -> None:
        self.ex = ex
        self.transport = transport
        self.chunked = True
        self.flow: Paused = ex.conn
        self._head = head  # goes out with the first body bytes

    async def write(self, data: bytes) -> None:
        transport = self.transport
        if transport.is_closing():
            raise ConnectionResetError("client disconnected")
        if not data:
            return
        chunk = b"%x\r\n%b\r\n" % (len(data), data)
        if self._head:
            chunk, self._head = self._head + chunk, b""
        transport.write(chunk)
        if self.ex.conn.writing_paused:
            await self.ex.conn.drain()

    async def write_eof(self, data: bytes = b"") -> None:
        transport = self.transport
        if transport.is_closing():
            raise ConnectionResetError("client disconnected")
        out = b"%x\r\n%b\r\n%b" % (len(data), data, _LAST_CHUNK) if data else _LAST_CHUNK
        if self._head:
            out, self._head = self._head + out, b""
        transport.write(out)
        self.ex.complete = True

    async def drain(self) -> None:
        await self.ex.conn.drain()


class FrontExchange:
    __slots__ = ("_sink", "body", "complete", "conn", "head", "keep_alive")

    def __init__(self, conn: FrontProtocol, head: Head, body: bytes | None) -> None:
        self.conn = conn
        self.head = head
        self.body = body  # None: over serving.max_request_bytes, not read
        self.keep_alive = head.keep_alive and body is not None
        self.complete = False  # the whole response is written
        self._sink: _Sink | None = None

    @property
    def client_rid(self) -> str | None:
        return self.head.client_rid

    @property
    def content_length(self) -> int | None:
        return self.head.content_length

    @property
    def sink(self) -> _Sink | None:
        return self._sink

    async def read_body(self) -> bytes:
        if self.body is None:
            raise BodyTooLarge
        return self.body

    def _transport(self) -> asyncio.Transport:
        transport = self.conn.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("client disconnected")
        return transport

    def respond(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        transport = self.conn.transport
        if transport is None or transport.is_closing():
            return  # nobody to answer; the outcome is already settled
        keep = self.keep_alive and not self.conn.closing
        self.keep_alive = keep
        transport.write(response_head(status, headers, len(body), keep) + body)
        self.complete = True

    async def open_stream(self, headers: Mapping[str, str]) -> _Sink:
        transport = self._transport()
        self.keep_alive = keep = self.keep_alive and not self.conn.closing
        self._sink = _Sink(self, transport, response_head(200, headers, None, keep))
        return self._sink

    def abandon(self) -> None:
        self.keep_alive = False


class FrontProtocol(asyncio.Protocol):
    """One client connection: serves completion requests itself, hands anything else to aiohttp."""

    def __init__(self, front: FrontServer) -> None:
        self.front = front
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.task: asyncio.Task[None] | None = None
        self.closing = False
        self.writing_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._read_paused = False
        self.requests = 0  # request heads received
        self._idle_since = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None
        self._delegated = False
        self._pending: Head | None = None  # a head whose body is still arriving
        self._discard = 0  # bytes of a body over the limit still to read and drop
        self._linger: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.front.connections.add(self)
        if self.front.guard is not None:
            self.front.guard.watch(transport)  # the header timeout counts from now
        self._idle_since = self.loop.time()
        self._idle_timer = self.loop.call_at(self._idle_since + self.front.idle_timeout, self._idle_check)

    def data_received(self, data: bytes) -> None:
        if self._discard:
            n = min(len(data), self._discard)
            self._discard -= n
            if not self._discard and self._linger is not None and self.transport is not None:
                self.transport.close()  # the refused body has been read: the client saw the answer
            return
        self.buf += data
        if self.task is None:
            self._next()
        elif len(self.buf) > self.front.max_body + 2 * MAX_HEAD and not self._read_paused:
            self._read_paused = True  # a pipelined request waits for this one; stop reading
            assert self.transport is not None
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        return None  # close: a half-closed client gets no more requests served

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._delegated:
            return
        self.front.connections.discard(self)
        self.transport = None
        for timer in (self._idle_timer, self._linger):
            if timer is not None:
                timer.cancel()
        self._idle_timer = self._linger = None
        if self.task is not None:
            self.task.cancel()  # the client left: the handler settles the request as cancelled
        self._wake(ConnectionResetError("client disconnected"))

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._wake(None)

    # -- the graceful stop (FrontServer.close / shutdown) -------------------------------------
    def close(self) -> None:
        """Finish the request in progress, then close; close now when idle."""
        self.closing = True
        if self.task is None and self.transport is not None:
            self.transport.close()

    async def shutdown(self, timeout: float | None) -> None:  # noqa: ASYNC109 (the stop's grace)
        self.closing = True
        task = self.task
        if task is not None:
            await asyncio.wait({task}, timeout=timeout)
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.transport is not None:
            self.transport.close()

    # -- flow control ---------------------------------------------------------------------------
    async def drain(self) -> None:
        if self.transport is None:
            raise ConnectionResetError("client disconnected")
        if not self.writing_paused:
            return
        waiter = self._drain
        if waiter is None or waiter.done():
            waiter = self._drain = self.loop.create_future()
        await waiter

    def _wake(self, exc: BaseException | None) -> None:
        waiter, self._drain = self._drain, None
        if waiter is not None and not waiter.done():
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)

    # -- requests -------------------------------------------------------------------------------
    def _next(self) -> None:
        """Start the request at the head of the buffer, if it is all there."""
        if self.closing or self.transport is None or not self.buf:
            return
        found = self._pending or scan(self.buf)
        if found is None:
            return
        if found == DELEGATE:
            self._delegate()
            return
        assert isinstance(found, Head)
        if self._pending is None:
            self.requests += 1
            if self.requests == 1 and self.front.guard is not None:
                self.front.guard.head_arrived(self.transport)
        total = found.size + found.content_length
        if found.content_length > self.front.max_body:
            # answered 413 without its body; the body is read and dropped (up to LINGER_S after
            # the answer) so the client is not cut off mid-send, then the connection closes
            body = None
            self._discard = max(0, total - len(self.buf))
            self.buf.clear()
        elif len(self.buf) < total:
            self._pending = found
            self._idle_since = self.loop.time()  # a body on its way: idle counts from its last bytes
            return
        else:
            body = bytes(self.buf[found.size : total])
            del self.buf[:total]
        self._pending = None
        ex = FrontExchange(self, found, body)
        self.task = self.loop.create_task(self._run(ex, found.endpoint))

    async def _run(self, ex: FrontExchange, endpoint: Endpoint) -> None:
        try:
            await self.front.serving.handle(ex, endpoint)
        except asyncio.CancelledError:
            pass  # the client left or the stop's grace ran out; the handler settled the request
        except Exception:  # the handler settles every request itself; this is a bug in the router
            log.exception("completion request failed outside the handler")
        finally:
            self._done(ex)

    def _done(self, ex: FrontExchange) -> None:
        self.task = None
        transport = self.transport
        if transport is None:
            return
        if self._discard and ex.complete and not self.closing:
            self._linger = self.loop.call_later(LINGER_S, transport.close)
            return
        if not ex.complete or not ex.keep_alive or self.closing:
            transport.close()  # a cut or unanswered response, Connection: close, or the stop
            return
        self._idle_since = self.loop.time()
        if self._read_paused:
            self._read_paused = False
            transport.resume_reading()
        if self.buf:
            self._next()

    def _idle_check(self) -> None:
        transport = self.transport
        if transport is None:
            return
        timeout = self.front.idle_timeout
        now = self.loop.time()
        if self.task is None and now - self._idle_since >= timeout:
            self._idle_timer = None
            transport.close()
            return
        due = self._idle_since + timeout if self.task is None else now + timeout
        self._idle_timer = self.loop.call_at(due, self._idle_check)

    def _delegate(self) -> None:
        """Hand the connection, and what it sent so far, to aiohttp (at a request boundary)."""
        transport = self.transport
        assert transport is not None
        front = self.front
        self._delegated = True
        front.delegated += 1
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        front.connections.discard(self)
        handler = front.server()  # aiohttp's protocol; it counts in web.Server.connections
        self.transport = None
        data, self.buf = bytes(self.buf), bytearray()
        if self._read_paused:
            transport.resume_reading()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        handler.data_received(data)
