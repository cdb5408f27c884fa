"""The separate control listener (``control.port`` / ``--control-port``, our extension).

When a control port is configured, ``narwhal-serve`` binds a second site on ``control.host``
(default: the client ``--host``) and the control plane is split by the listener a request arrived
on (the local port of its connection):

* client listener: everything except ``/narwhal/*``, which answers 404 with a JSON error (the
  control address is not revealed);
* control listener: ``/narwhal/*`` plus ``/health``, ``/ready`` and ``/metrics`` (operators and
  warm standbys poll them there); anything else, completions included, answers 404.

Both sites share one application, so the two listeners see the same state. The middleware is the
outermost one: a control route on the wrong listener is refused before authentication runs.
Without a control port nothing changes: every route is on the one listener.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson
from aiohttp import web

from router.config import ConfigError, FleetConfig
from router.connections import CONTROL_EXTRA, Listeners
from router.options import RouterOptions

CONTROL_PREFIX = "/narwhal/"
CONTROL_OPS = frozenset({"/health", "/ready", "/metrics"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class ControlListener:
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def control_listener(config: FleetConfig, options: RouterOptions) -> ControlListener | None:
    """The control address (flags over the fleet file), or None; ConfigError when unusable."""
    flag_port = options.control_port
    flag_host = options.control_host
    port = flag_port if flag_port is not None else config.control.port
    host = flag_host or config.control.host or options.host
    if not port:
        if flag_host:
            raise ConfigError("--control-host needs a control port (--control-port or control.port)")
        return None
    if not 0 < port <= 65535:
        raise ConfigError(f"control port {port} is not a TCP port (1-65535)")
    if port == options.port:
        raise ConfigError(f"control port {port} is the client --port: the listeners need distinct ports")
    return ControlListener(host, port)


def is_loopback(host: str) -> bool:
    """True for a loopback address or ``localhost``; an empty host or a wildcard is not."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname: it may resolve anywhere


def open_control_warning(config: FleetConfig, options: RouterOptions) -> str:
    """A start-up warning when ``/narwhal/*`` is reachable beyond loopback without a token, else ""."""
    if config.control.token_env:
        return ""
    listener = control_listener(config, options)
    host = listener.host if listener is not None else options.host
    if is_loopback(host):
        return ""
    where = "control listener" if listener is not None else "client listener"
    return (
        f"control plane is open: /narwhal/* (drain, readmit, handoff) is served on the {where} {host} "
        "without a token; anyone who can reach it can drain the fleet. Set control.token_env (and "
        "control.port for a separate, unpublished listener)"
    )


def is_control_path(path: str) -> bool:
    return path.startswith(CONTROL_PREFIX) or path == CONTROL_PREFIX.rstrip("/")


def _not_found(message: str, code: str) -> web.Response:
    body = orjson.dumps({"error": {"message": message, "type": "not_found", "code": code}})
    return web.Response(status=404, body=body, content_type="application/json")


def listener_middleware(control_port: int) -> Middleware:
    """Route by listener: the local port of the connection the request arrived on."""

    @web.middleware
    async def split_listeners(request: web.Request, handler: Handler) -> web.StreamResponse:
        transport = request.transport
        sockname = transport.get_extra_info("sockname") if transport is not None else None
        on_control = isinstance(sockname, tuple) and len(sockname) >= 2 and sockname[1] == control_port
        path = request.path
        resource = request.match_info.route.resource
        canonical = resource.canonical if resource is not None else path
        control_route = is_control_path(path) or is_control_path(canonical)
        if on_control:
            if control_route or canonical in CONTROL_OPS:
                return await handler(request)
            return _not_found("not served on the control listener", "client_route_on_control_listener")
        if control_route:
            return _not_found("control API is served on the control listener", "control_listener_only")
        return await handler(request)

    return split_listeners


def install_listener_split(app: web.Application, config: FleetConfig, options: RouterOptions) -> None:
    """Validate the control address now (ConfigError → exit 2) and add the middleware, outermost."""
    listener = control_listener(config, options)
    if listener is not None:
        app.middlewares.insert(0, listener_middleware(listener.port))  # type: ignore[arg-type]


async def start_control_site(
    runner: web.BaseRunner, config: FleetConfig, options: RouterOptions, listening: Listeners | None = None
) -> ControlListener | None:
    """Bind the control listener on ``runner`` (after the client site); None when not configured.

    Through ``listening`` (the connection guard's listeners) it may hold ``CONTROL_EXTRA``
    connections beyond the client bound, so operators and the standby get in while the client
    listener is full; without it, it is a plain ``web.TCPSite``."""
    listener = control_listener(config, options)
    if listener is None:
        return None
    if listening is not None:
        assert runner.server is not None
        await listening.open(runner.server, listener.host, listener.port, extra=CONTROL_EXTRA)
    else:
        await web.TCPSite(runner, listener.host, listener.port, backlog=128, reuse_address=True).start()
    return listener
