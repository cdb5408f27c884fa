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

Only aiohttp's public API is used (``tests/unit/test_aiohttp_public.py`` checks ``router/`` for
private names): the listeners are our own ``loop.create_server`` sockets (:class:`Listeners`), an
aiohttp connection is the protocol a ``web.Server`` instance returns when called, the bound counts
``web.Server.connections`` plus the front's own connections, the header timeout watches transports
(a request head has arrived once the outermost middleware saw a request on that transport, or the
front read one), and the graceful stop runs from the application's ``on_shutdown`` /
``on_cleanup`` signals, so ``AppRunner.cleanup`` stops everything in the usual order.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from aiohttp import web

from router.config import ServingSettings
from router.tasks import Tasks

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


class _ToAiohttp(asyncio.Protocol):
    """An accepted connection for aiohttp: the header timeout starts watching its transport, then
    aiohttp's protocol (what calling the ``web.Server`` gives) takes the transport over."""

    def __init__(self, guard: ConnectionGuard, server: web.Server) -> None:
        self.guard = guard
        self.server = server

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.guard.watch(transport)
        handler = self.server()
        transport.set_protocol(handler)
        handler.connection_made(transport)


class Front(Protocol):
    """The client listener's own protocol (``serving.front.FrontServer``): its connections count
    against the bound, and the graceful stop closes them."""

    def __call__(self) -> asyncio.BaseProtocol: ...

    def __len__(self) -> int:
        """Connections open (not handed to aiohttp)."""

    def close(self) -> None:
        """Close idle connections now; the others after the response in progress."""

    async def shutdown(self, timeout: float) -> None:  # noqa: ASYNC109
        """Wait up to ``timeout`` for the requests in progress, cancel the rest, close."""


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Factory = Callable[[], asyncio.BaseProtocol]


class ConnectionGuard:
    """Protocol factories with a bound per listener, plus the header-timeout sweeper."""

    def __init__(self, settings: ServingSettings) -> None:
        self.settings = settings
        self.bound = client_bound(settings)
        self.refused = 0
        # transports still waiting for their first request head (pruned by the sweeper)
        self._waiting: dict[asyncio.BaseTransport, float] = {}
        self._servers: list[web.Server] = []
        self._fronts: list[Front] = []
        self._tasks = Tasks(log)
        self.header_timeouts = 0

    def runner_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``web.AppRunner``: the idle timeout is aiohttp's keep-alive timer."""
        return {"keepalive_timeout": self.settings.idle_timeout_s}

    def open_connections(self) -> int:
        return sum(len(s.connections) for s in self._servers) + sum(len(f) for f in self._fronts)

    def factory(self, server: web.Server, extra: int = 0, front: Front | None = None) -> Factory:
        """A listener's protocol factory under the bound: ``front`` (which calls :meth:`watch` and
        :meth:`head_arrived` itself), or aiohttp's protocol from ``server``."""
        if server not in self._servers:
            self._servers.append(server)
        if front is not None and front not in self._fronts:
            self._fronts.append(front)
        limit = self.bound + extra

        def make() -> asyncio.BaseProtocol:
            if (open_now := self.open_connections()) >= limit:
                self.refused += 1
                if self.refused == 1 or self.refused % 1000 == 0:
                    log.warning("connection refused: %d open, bound %d (refused so far: %d)",
                                open_now, limit, self.refused)  # fmt: skip
                return _Refused()
            return front() if front is not None else _ToAiohttp(self, server)

        return make

    def watch(self, transport: asyncio.BaseTransport) -> None:
        """A new connection: the header timeout counts from now."""
        self._waiting[transport] = asyncio.get_running_loop().time()

    def head_arrived(self, transport: asyncio.BaseTransport | None) -> None:
        """The connection delivered a request head: the header timeout no longer applies to it."""
        if transport is not None:
            self._waiting.pop(transport, None)

    def middleware(self) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
        """The outermost middleware: a request reached aiohttp's handler, so its head arrived."""

        @web.middleware
        async def first_request(request: web.Request, handler: Handler) -> web.StreamResponse:
            if self._waiting:
                self.head_arrived(request.transport)
            return await handler(request)

        return first_request

    async def start(self) -> None:
        self._tasks.spawn(self._sweep(), "narwhal-header-timeout")

    async def stop(self) -> None:
        await self._tasks.stop()

    def sweep_once(self, now: float) -> int:
        """Close connections whose first request head did not arrive in time; returns how many."""
        closed = 0
        limit = self.settings.header_timeout_s
        for transport, accepted in list(self._waiting.items()):
            if transport.is_closing():  # closed meanwhile
                del self._waiting[transport]
            elif now - accepted >= limit:
                del self._waiting[transport]
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


class Listeners:
    """The router's TCP listeners — ``loop.create_server`` with a :class:`ConnectionGuard` factory —
    and their graceful stop, run by ``AppRunner.cleanup`` through the application's signals:

    1. ``on_shutdown`` (first): the listeners close (a new connection is refused) and the fronts
       close their idle connections; their requests in progress get ``graceful_s`` from now —
       while aiohttp's own connections get the runner's ``shutdown_timeout`` (the same value);
    2. ``on_cleanup`` (first): waits for the fronts, so the router's components stop after the
       last request."""

    def __init__(self, guard: ConnectionGuard, graceful_s: float) -> None:
        self.guard = guard
        self.graceful_s = graceful_s
        self._servers: list[asyncio.Server] = []
        self._fronts: list[Front] = []
        self._draining: asyncio.Task[None] | None = None

    def install(self, app: web.Application) -> None:
        """Before ``AppRunner.setup``: the header-timeout middleware and the stop signals."""
        app.middlewares.insert(0, self.guard.middleware())  # type: ignore[arg-type]
        app.on_shutdown.insert(0, self._on_shutdown)
        app.on_cleanup.insert(0, self._on_cleanup)

    async def open(self, server: web.Server, host: str, port: int, *, extra: int = 0,
                   front: Front | None = None, backlog: int = 128) -> int:  # fmt: skip
        """Listen on ``host:port``; returns the bound port. ``extra``: connections beyond the bound."""
        loop = asyncio.get_running_loop()
        factory = self.guard.factory(server, extra, front)
        listening = await loop.create_server(factory, host, port, backlog=backlog, reuse_address=True)
        self._servers.append(listening)
        if front is not None:
            self._fronts.append(front)
        return int(listening.sockets[0].getsockname()[1])

    def stop_accepting(self) -> None:
        """New connections are refused from now; the fronts close their idle connections."""
        for listening in self._servers:
            listening.close()
        for front in self._fronts:
            front.close()
        if self._draining is None:
            self._draining = asyncio.get_running_loop().create_task(self._drain(), name="narwhal-drain")

    async def _drain(self) -> None:
        await asyncio.gather(*(front.shutdown(self.graceful_s) for front in self._fronts))

    async def _on_shutdown(self, _: web.Application) -> None:
        self.stop_accepting()

    async def _on_cleanup(self, _: web.Application) -> None:
        self.stop_accepting()  # no-op after on_shutdown (a failed start-up skips it)
        assert self._draining is not None
        await self._draining
