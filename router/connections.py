"""Connection hygiene for the router's listeners: a bound, a header-read timeout, an idle timeout
and a file-descriptor reserve for the control plane's own files and sockets.

- **Bound**: each listener accepts at most ``bound`` connections; one more is accepted and closed at
  once (counted in ``narwhal_connections_refused_total``), so a flood never takes the descriptors
  the lease renewal, the state-file writes and the engine legs need. The client bound is
  ``min(serving.max_client_connections, (RLIMIT_NOFILE − serving.fd_reserve) // 2)``: half of the
  descriptors left after the reserve go to client connections, the other half to engine legs. The
  control listener may take ``CONTROL_EXTRA`` more, so operators and the standby still get in while
  the client listener is full.
- **Header-read timeout** (``serving.header_timeout_s``): a new connection that has not delivered a
  complete request head within it is closed.
- **Idle timeout** (``serving.idle_timeout_s``): a connection with no request in progress — idle
  keep-alive, or a request whose headers never complete — is closed after it (aiohttp's keep-alive
  timer, which also runs from the moment a connection is accepted).

Requests in progress are never cut by these timeouts (``serving.request_timeout_s`` bounds them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from router.config import ServingSettings

log = logging.getLogger("narwhal.connections")
CONTROL_EXTRA = 32
MIN_BOUND = 16


def nofile_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def client_bound(settings: ServingSettings, nofile: int | None = None) -> int:
    """Client connections this process accepts at once (see the module docstring)."""
    usable = (nofile if nofile is not None else nofile_limit()) - settings.fd_reserve
    return max(MIN_BOUND, min(settings.max_client_connections, usable // 2))


class _Refused(asyncio.Protocol):
    """Closes a connection over the bound as soon as it is accepted."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if isinstance(transport, asyncio.Transport):
            transport.abort()
        else:
            transport.close()


class Accepted(Protocol):
    """A connection the header timeout watches: aiohttp's ``RequestHandler`` or the client listener's
    ``serving.front.FrontProtocol`` (both count requests in ``_request_count``)."""

    @property
    def transport(self) -> asyncio.Transport | None: ...

    def force_close(self) -> None: ...


Connection = Callable[[], Any]  # a protocol factory: a new connection's protocol


class ConnectionGuard:
    """Protocol factories with a bound per listener, plus the header-timeout sweeper."""

    def __init__(self, settings: ServingSettings) -> None:
        self.settings = settings
        self.bound = client_bound(settings)
        self.refused = 0
        # connections still waiting for their first request head (pruned by the sweeper)
        self._accepted_at: dict[Accepted, float] = {}
        self._server: web.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.header_timeouts = 0

    def runner_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``web.AppRunner``: the idle timeout is aiohttp's keep-alive timer."""
        return {"keepalive_timeout": self.settings.idle_timeout_s}

    def open_connections(self) -> int:
        return len(self._server.connections) if self._server is not None else 0

    def factory(self, server: web.Server, extra: int = 0, protocol: Connection | None = None) -> Any:
        """The listener's protocol factory: ``protocol`` (default: aiohttp's ``server()``) under the
        bound. A ``protocol`` must register its connections with ``server`` (they count)."""
        self._server = server
        limit = self.bound + extra
        loop = asyncio.get_running_loop()
        make_protocol = protocol or server

        def make() -> asyncio.BaseProtocol:
            if len(server.connections) >= limit:
                self.refused += 1
                if self.refused == 1 or self.refused % 1000 == 0:
                    log.warning("connection refused: %d open, bound %d (refused so far: %d)",
                                len(server.connections), limit, self.refused)  # fmt: skip
                return _Refused()
            conn = make_protocol()
            self._accepted_at[conn] = loop.time()
            return conn

        return make

    def adopt(self, old: Accepted, new: RequestHandler) -> None:
        """A connection changed protocol before its first request (the front handed it to aiohttp):
        the header timeout keeps counting from its acceptance."""
        accepted = self._accepted_at.pop(old, None)
        if accepted is not None:
            self._accepted_at[new] = accepted

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._sweep(), name="narwhal-header-timeout")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def sweep_once(self, now: float) -> int:
        """Close connections whose first request head did not arrive in time; returns how many."""
        closed = 0
        limit = self.settings.header_timeout_s
        for handler, accepted in list(self._accepted_at.items()):
            gone = handler.transport is None and now - accepted > 0.1  # closed meanwhile
            if gone or getattr(handler, "_request_count", 1) > 0:  # or a request head arrived
                self._accepted_at.pop(handler, None)
                continue
            if now - accepted >= limit:
                self._accepted_at.pop(handler, None)
                handler.force_close()
                transport = handler.transport
                if transport is not None:
                    transport.close()
                closed += 1
        self.header_timeouts += closed
        return closed

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        period = max(0.05, min(1.0, self.settings.header_timeout_s / 4))
        while True:
            await asyncio.sleep(period)
            self.sweep_once(loop.time())

    def metric_lines(self) -> Iterable[str]:
        return [
            "# HELP narwhal_client_connections Open connections on the router's listeners.",
            "# TYPE narwhal_client_connections gauge",
            f"narwhal_client_connections {self.open_connections()}",
            "# HELP narwhal_client_connection_bound Connections the client listener accepts at once.",
            "# TYPE narwhal_client_connection_bound gauge",
            f"narwhal_client_connection_bound {self.bound}",
            "# HELP narwhal_connections_refused_total Connections closed at accept: over the bound.",
            "# TYPE narwhal_connections_refused_total counter",
            f"narwhal_connections_refused_total {self.refused}",
            "# HELP narwhal_header_timeouts_total Connections closed: no request head within header_timeout_s.",
            "# TYPE narwhal_header_timeouts_total counter",
            f"narwhal_header_timeouts_total {self.header_timeouts}",
        ]


class GuardedSite(web.TCPSite):
    """``web.TCPSite`` whose connections go through a ``ConnectionGuard`` factory."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard, extra: int = 0,
                 protocol: Connection | None = None, **kw: Any) -> None:  # fmt: skip
        super().__init__(runner, host, port, **kw)
        self._guard = guard
        self._extra = extra
        self._protocol = protocol

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._guard.factory(server, self._extra, self._protocol),
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
