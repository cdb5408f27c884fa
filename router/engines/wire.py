"""HTTP/1.1 to the engines on asyncio protocols: keep-alive pool, ``httptools`` (llhttp) parsing.

The data plane's engine legs are small, known-shape requests (a JSON POST) answered either with a
JSON body (prefill, errors) or a chunked SSE stream (decode). A general HTTP client does far more
per request and per body chunk than that needs; this one writes a prebuilt request head and body
with one ``transport.write`` and parses responses in C. Body bytes are delivered to the
:class:`Response` from the connection's ``data_received`` callback: buffered for ``readany()`` /
``read()``, or — once a listener is attached — handed straight to it, so a relay can forward a
decode stream to its client without waking a task per token.

Errors: :class:`ConnectFailed` (no connection: refused, unreachable, connect timeout),
:class:`ConnectionLost` (connected, then lost before the response ended), :class:`BadResponse`
(not HTTP), :class:`ResponseTooLarge` (over the caller's byte limit); ``TimeoutError`` is set by
the caller's deadline or the stream watchdog.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from typing import Protocol

import httptools

_HEX = b"0123456789abcdefABCDEF"
# The most bytes of one read handled in one event-loop callback. A larger read (up to 256 KiB from
# the transport) is handled a slice per loop iteration, with reading paused until the last slice:
# an engine sending 1-byte HTTP chunks (~6 wire bytes each) costs at most ~2,700 parser and framer
# steps per callback, and the client, other requests and timers get their turn in between.
READ_SLICE = 16384


class WireError(Exception):
    """A failed engine exchange."""


class DeadlineExceeded(TimeoutError):
    """The caller's bound on the exchange (``Response.deadline``) passed."""


class ConnectFailed(WireError):
    pass


class ConnectionLost(WireError):
    pass


class BadResponse(WireError):
    pass


class ResponseTooLarge(WireError):
    pass


def whole_chunks(data: bytes) -> tuple[list[bytes], int]:
    """(the data of each chunk, bytes used) for the whole, non-empty chunks of a chunked body at
    the start of ``data`` (size in hex, no extension, each ending with CRLF); the rest — a cut
    chunk, an extension, the last chunk — is left for the parser."""
    out: list[bytes] = []
    pos, end = 0, len(data)
    while pos < end:
        i = data.find(b"\r\n", pos, pos + 10)
        if i <= pos or data[pos:i].lstrip(_HEX):
            break
        n = int(data[pos:i], 16)
        nxt = i + n + 4
        if not n or nxt > end or data[nxt - 2 : nxt] != b"\r\n":
            break
        out.append(data[i + 2 : nxt - 2])
        pos = nxt
    return out, pos


class Listener(Protocol):
    """Receives a response body from the connection's callbacks (after ``Response.attach``).

    ``on_raw`` is offered each read that starts at a chunk boundary of a chunked body, with the
    body bytes the response limit still allows: it takes what it can from the start (the usual
    decode-stream tokens, whole chunks: the parser is skipped for them) and returns (bytes of
    ``data`` taken, body bytes in them) — (0, 0) for nothing. ``on_chunks`` gets the data of the
    next whole chunks of the read, one item per chunk; ``on_data`` gets what the parser delivered
    otherwise. Either way the bytes are the body, in order.
    """

    def on_raw(self, data: bytes, budget: int) -> tuple[int, int]: ...

    def on_chunks(self, bodies: list[bytes]) -> None: ...

    def on_data(self, chunks: list[bytes]) -> None: ...

    def on_end(self) -> None: ...

    def on_error(self, exc: BaseException) -> None: ...


class Response:
    """One engine response: status, then body bytes (buffered, or pushed to an attached listener)."""

    __slots__ = (
        "_chunks",
        "_exc",
        "_head",
        "_listener",
        "_waiter",
        "complete",
        "conn",
        "deadline",
        "idle_limit",
        "last_rx",
        "limit",
        "on_close",
        "received",
        "status",
    )

    def __init__(self, conn: EngineConnection, limit: int) -> None:
        self.conn = conn
        self.limit = limit  # body bytes; over it the response fails with ResponseTooLarge
        self.status = 0
        self.received = 0
        self.complete = False  # the whole message was parsed
        self.last_rx = 0.0  # loop time of the last body bytes (the stream watchdog reads it)
        self.deadline = 0.0  # loop time by which the caller's bound ends (0: none); see watchdog
        self.idle_limit = 0.0  # longest silence between body bytes (0: unbounded)
        self._chunks: list[bytes] = []
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._head: asyncio.Future[None] = conn.loop.create_future()
        self._listener: Listener | None = None
        self.on_close: Callable[[Response], None] | None = None  # called once by close()/release()

    @property
    def content(self) -> Response:
        """``readany()`` lives on the response itself (the shape ``DecodeStream`` reads)."""
        return self

    # -- from the connection ----------------------------------------------------------------
    def _on_head(self, status: int) -> None:
        self.status = status
        if not self._head.done():
            self._head.set_result(None)

    def _on_body(self, body: bytes) -> None:
        self.received += len(body)
        if self.received <= self.limit:  # over it: data_received fails the response after the parse
            self._chunks.append(body)

    def _flush(self) -> None:
        """After one ``data_received``: hand what arrived to the listener, or wake the reader."""
        if not self._chunks:
            return
        self.last_rx = self.conn.loop.time()
        if self._listener is not None:
            chunks, self._chunks = self._chunks, []
            self._listener.on_data(chunks)
            if self.complete and self._listener is not None:
                self._listener.on_end()
        else:
            self._wake()

    def _on_complete(self) -> None:
        self.complete = True
        if self._listener is not None and not self._chunks:
            self._listener.on_end()
        else:
            self._wake()

    def _fail(self, exc: BaseException) -> None:
        if self._exc is not None:
            return
        self._exc = exc
        if not self._head.done():
            self._head.set_exception(exc)
            self._head.exception()  # retrieved here: the waiter may be gone already
        if self._listener is not None:
            self._listener.on_error(exc)
        else:
            self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    # -- for the caller ---------------------------------------------------------------------
    async def head(self) -> None:
        await self._head

    async def readany(self) -> bytes:
        """The body bytes that arrived since the last call (waiting for some); b"" at the end."""
        while not self._chunks:
            if self._exc is not None:  # first: a whole message over the limit is complete, and failed
                raise self._exc
            if self.complete:
                return b""
            self._waiter = self.conn.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunks, self._chunks = self._chunks, []
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def read(self) -> bytes:
        parts: list[bytes] = []
        while chunk := await self.readany():
            parts.append(chunk)
        return b"".join(parts)

    def take_buffered(self) -> list[bytes]:
        chunks, self._chunks = self._chunks, []
        return chunks

    def attach(self, listener: Listener | None) -> None:
        """Push future body bytes (and the end or a failure) to ``listener`` from the callbacks."""
        self._listener = listener
        if listener is None:
            return
        if self._exc is not None:
            listener.on_error(self._exc)
            return
        if self._chunks:  # bytes that arrived before the listener: first, in order
            chunks, self._chunks = self._chunks, []
            listener.on_data(chunks)
        if self.complete and self._listener is listener:
            listener.on_end()

    def fail(self, exc: BaseException) -> None:
        """Fail the response from outside (deadline, watchdog) and drop the connection."""
        self._fail(exc)
        self.conn.abort()

    def pause_reading(self) -> None:
        self.conn.pause_reading()

    def resume_reading(self) -> None:
        self.last_rx = self.conn.loop.time()  # the silence while paused was ours, not the engine's
        self.conn.resume_reading()

    def close(self) -> None:
        """Drop the connection (not back to the pool): the engine sees the client go away."""
        self._done()
        self.conn.abort()

    def release(self) -> None:
        """Return the connection to its pool when the response ended cleanly, else drop it."""
        self._done()
        self.conn.finish(self)

    def _done(self) -> None:
        self._listener = None
        cb, self.on_close = self.on_close, None
        if cb is not None:
            cb(self)


class EngineConnection(asyncio.Protocol):
    """One keep-alive connection to an engine; parses one response at a time."""

    def __init__(self, pool: EnginePool, key: tuple[str, int], loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.key = key
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.response: Response | None = None
        self.reused = False
        self.keep_alive = True
        self.closed = False
        self.reading = True  # False while the router paused reading (a slow client downstream)
        self.backlog = b""  # the rest of a read over READ_SLICE, handled on the next iterations
        self._paused = False  # the transport's reading is paused (by ``reading`` or a backlog)
        self._resume_soon = False  # a _continue is scheduled
        # The parser has just finished a chunk of a chunked body and holds nothing after it: the
        # next read, when it is exactly one whole chunk, can skip the parser (see data_received).
        self.at_boundary = False

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        if self.backlog:  # a transport that delivered after its pause: after the backlog, in order
            self.backlog += data
            return
        if len(data) > READ_SLICE:
            data, self.backlog = data[:READ_SLICE], data[READ_SLICE:]
            self._hold()
        self._receive(data)

    def _hold(self) -> None:
        """Pause the transport until the backlog is handled; handle its next slice soon (unless
        the router paused reading: ``resume_reading`` goes on with it)."""
        self._set_paused()
        if self.reading and not self._resume_soon:
            self._resume_soon = True
            self.loop.call_soon(self._continue)

    def _continue(self) -> None:
        self._resume_soon = False
        if self.closed or not self.backlog:
            self.backlog = b""
            return
        if not self.reading:
            return  # paused for a slow client: resume_reading goes on from here
        data = self.backlog
        if len(data) > READ_SLICE:
            data, self.backlog = data[:READ_SLICE], data[READ_SLICE:]
            self._hold()
        else:
            self.backlog = b""
            self._set_paused()
        self._receive(data)

    def _set_paused(self) -> None:
        transport = self.transport
        paused = not self.reading or bool(self.backlog)
        if transport is not None and not self.closed and paused != self._paused:
            self._paused = paused
            if paused:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def _receive(self, data: bytes) -> None:
        resp, parser = self.response, self.parser
        if resp is None or parser is None:
            self.abort()  # bytes nobody asked for: the connection is not reusable
            return
        listener = resp._listener
        if self.at_boundary and listener is not None and not resp._chunks:
            # Fast path for a relayed stream: the whole chunks "<hex>\r\n<data>\r\n" this read starts
            # with (token events) skip the parser. It stays at the same chunk boundary, so it takes
            # over again for the rest (a chunk cut between reads, an extension, the last chunk).
            used, body_bytes = listener.on_raw(data, resp.limit - resp.received)
            if used:
                resp.received += body_bytes
                resp.last_rx = self.loop.time()
                if used == len(data) or self.response is not resp:
                    return
                data = data[used:]
            bodies, used = whole_chunks(data)
            if bodies:
                resp.received += sum(map(len, bodies))
                if resp.received > resp.limit:
                    resp._fail(ResponseTooLarge(f"engine response exceeds {resp.limit} bytes"))
                    self.abort()
                    return
                resp.last_rx = self.loop.time()
                listener.on_chunks(bodies)
                if used == len(data) or self.response is not resp:
                    return
                data = data[used:]  # the rest (a cut chunk, the last chunk) goes to the parser
        self.at_boundary = False
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            resp._fail(BadResponse("engine answered with a protocol upgrade"))
            self.abort()
            return
        except httptools.HttpParserError as exc:
            resp._fail(BadResponse(f"engine response is not valid HTTP: {exc}"))
            self.abort()
            return
        if resp.received > resp.limit:
            resp._fail(ResponseTooLarge(f"engine response exceeds {resp.limit} bytes"))
            self.abort()
            return
        if self.at_boundary and not data.endswith(b"\r\n"):
            self.at_boundary = False  # a partial chunk header follows the finished chunk
        resp._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.backlog and not self.closed:  # what arrived before the end, then the end
            data, self.backlog = self.backlog, b""
            self._receive(data)
        self.closed = True
        self.pool.forget(self)
        resp = self.response
        if resp is not None and not resp.complete:
            what = "before the response" if not resp.status else "before the response ended"
            resp._fail(ConnectionLost(f"engine closed the connection {what}"))

    # -- httptools callbacks ----------------------------------------------------------------
    def on_headers_complete(self) -> None:
        assert self.parser is not None and self.response is not None
        self.keep_alive = self.parser.should_keep_alive()
        self.response._on_head(self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        assert self.response is not None
        self.response._on_body(body)

    def on_chunk_header(self) -> None:
        self.at_boundary = False

    def on_chunk_complete(self) -> None:
        self.at_boundary = True

    def on_message_complete(self) -> None:
        assert self.response is not None
        self.at_boundary = False
        self.response._on_complete()

    # -- requests ---------------------------------------------------------------------------
    def send(self, data: bytes, limit: int) -> Response:
        assert self.transport is not None
        self.response = resp = Response(self, limit)
        self.parser = httptools.HttpResponseParser(self)
        self.at_boundary = False
        self.transport.write(data)
        return resp

    def finish(self, resp: Response) -> None:
        if resp is not self.response:
            return
        if resp.complete and self.keep_alive and not self.closed and not self.backlog:
            self.response = None
            self.parser = None
            self.resume_reading()
            self.pool.put(self)
        else:
            self.abort()

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed and self.reading:
            self.reading = False
            self._set_paused()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed and not self.reading:
            self.reading = True
            if self.backlog:
                self._hold()  # the rest of the last read first, a slice per iteration
            else:
                self._set_paused()

    def abort(self) -> None:
        self.response = None
        self.backlog = b""
        if self.transport is not None and not self.closed:
            self.closed = True
            self.pool.forget(self)
            self.transport.abort()


class EnginePool:
    """Idle keep-alive connections per engine address; new ones are made on demand (a leg never
    waits for a connection). At most ``max_open`` connections to all engines stay open
    (``serving.max_connections``): one finished while more are open is closed, not kept idle."""

    def __init__(
        self, connect_timeout: float, max_idle_per_engine: int = 1024, max_open: int | None = None
    ) -> None:
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle_per_engine
        self.max_open = max_open
        self._idle: dict[tuple[str, int], list[EngineConnection]] = {}
        self._all: set[EngineConnection] = set()

    async def acquire(self, key: tuple[str, int], tls: ssl.SSLContext | None = None) -> EngineConnection:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed:
                conn.reused = True
                return conn
        return await self.connect(key, tls)

    async def connect(self, key: tuple[str, int], tls: ssl.SSLContext | None = None) -> EngineConnection:
        loop = asyncio.get_running_loop()
        factory: Callable[[], EngineConnection] = lambda: EngineConnection(self, key, loop)  # noqa: E731
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(
                    factory, key[0], key[1], ssl=tls, server_hostname=key[0] if tls else None
                )
        except TimeoutError:
            raise ConnectFailed(f"connect timed out after {self.connect_timeout}s") from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect: {type(exc).__name__}") from None
        self._all.add(conn)
        return conn

    def put(self, conn: EngineConnection) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= self.max_idle or (self.max_open is not None and len(self._all) > self.max_open):
            conn.abort()
            return
        conn.reused = False
        idle.append(conn)

    @property
    def open_connections(self) -> int:
        return len(self._all)

    def forget(self, conn: EngineConnection) -> None:
        self._all.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    def close(self) -> None:
        for conn in list(self._all):
            conn.abort()
        self._all.clear()
        self._idle.clear()
