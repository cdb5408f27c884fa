"""What the completion handler needs from one client request, whichever server carries it.

``Serving.handle`` (``serving/handler.py``) talks to an :class:`Exchange`: the request's
``x-request-id`` and body, a whole response, or an SSE stream (:class:`StreamSink`). Two servers
implement it:

- ``serving/front.py`` — the client listener's own HTTP/1.1 protocol for ``POST /v1/completions`` and
  ``POST /v1/chat/completions`` (no request object, no route match, one prebuilt response head);
- :class:`AioExchange` here — aiohttp's request, for everything the front hands to aiohttp (a
  chunked or ``Expect`` request, HTTP/1.0, a query string), the control listener, a traced router
  and in-process test servers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from aiohttp import HttpVersion11, web
from aiohttp.abc import AbstractStreamWriter


class BodyTooLarge(Exception):
    """The request body is over ``serving.max_request_bytes``."""


class Paused(Protocol):
    """The client connection's write side: True while its transport is over the high-water mark."""

    @property
    def writing_paused(self) -> bool: ...


class StreamSink(Protocol):
    """An SSE response whose head is out (or goes out with the first bytes)."""

    transport: asyncio.Transport
    chunked: bool  # the relay frames its direct transport writes as HTTP chunks
    flow: Paused

    async def write(self, data: bytes) -> None: ...

    async def write_eof(self, data: bytes = b"") -> None: ...

    async def drain(self) -> None: ...


class Exchange(Protocol):
    @property
    def client_rid(self) -> str | None: ...

    @property
    def content_length(self) -> int | None: ...

    @property
    def sink(self) -> StreamSink | None:
        """The open SSE stream, once :meth:`open_stream` ran."""

    async def read_body(self) -> bytes:
        """The whole body; :class:`BodyTooLarge` over the limit."""

    def respond(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        """A whole response (nothing sent before it)."""

    async def open_stream(self, headers: Mapping[str, str]) -> StreamSink:
        """Start the SSE response; ``ConnectionResetError`` when the client is gone."""

    def abandon(self) -> None:
        """The client left before a response: drop the connection (aiohttp: a 499 it never reads)."""


class _TransportFlow:
    """:class:`Paused` from the transport alone (asyncio's public flow-control API): its write buffer
    is over the high-water mark — when asyncio pauses the protocol's writing."""

    __slots__ = ("high", "transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.high = transport.get_write_buffer_limits()[1]

    @property
    def writing_paused(self) -> bool:
        return self.transport.get_write_buffer_size() > self.high


class _AioSink:
    """An aiohttp ``StreamResponse`` after ``prepare``. The relay's own writes go to the request's
    transport (``BaseRequest.transport``) framed as the response is (``StreamResponse.chunked``: we
    enable chunking ourselves), after the handler's first ``write`` sent the head."""

    __slots__ = ("chunked", "flow", "resp", "transport", "writer")

    def __init__(
        self, resp: web.StreamResponse, request: web.BaseRequest, writer: AbstractStreamWriter | None
    ) -> None:
        transport = request.transport
        if transport is None or writer is None:
            raise ConnectionResetError("client disconnected")
        self.resp = resp
        self.writer = writer
        self.transport = transport
        self.chunked: bool = resp.chunked
        self.flow: Paused = _TransportFlow(transport)

    async def write(self, data: bytes) -> None:
        await self.resp.write(data)

    async def write_eof(self, data: bytes = b"") -> None:
        await self.resp.write_eof(data)

    async def drain(self) -> None:
        await self.writer.drain()


class AioExchange:
    """An aiohttp request as an :class:`Exchange`; ``response`` is what the route handler returns."""

    __slots__ = ("_sink", "request", "response")

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None
        self._sink: _AioSink | None = None

    @property
    def client_rid(self) -> str | None:
        return self.request.headers.get("x-request-id")

    @property
    def content_length(self) -> int | None:
        return self.request.content_length

    @property
    def sink(self) -> StreamSink | None:
        return self._sink

    async def read_body(self) -> bytes:
        try:
            return await self.request.read()
        except web.HTTPRequestEntityTooLarge:
            raise BodyTooLarge from None

    def respond(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        self.response = web.Response(status=status, body=body, headers=dict(headers))

    async def open_stream(self, headers: Mapping[str, str]) -> StreamSink:
        resp = web.StreamResponse(headers=dict(headers))
        if self.request.version == HttpVersion11:
            resp.enable_chunked_encoding()  # what aiohttp does for a body of unknown length, said
        self.response = resp
        writer = await resp.prepare(self.request)
        self._sink = _AioSink(resp, self.request, writer)
        return self._sink

    def abandon(self) -> None:
        pass  # ``result`` answers 499 when nothing was sent; aiohttp drops the connection

    def result(self) -> web.StreamResponse:
        """What the route returns: the response, or a 499 (the client is gone) when there is none."""
        return self.response if self.response is not None else web.Response(status=499)
