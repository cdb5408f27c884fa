"""Control-plane authentication for ``/narwhal/*`` (``control.token_env``, ``control.protect_reads``).

With ``control.token_env`` set, every ``/narwhal/*`` mutation needs ``Authorization: Bearer <token>``
(the token is read from that environment variable at startup; unset or empty fails startup, so a
misconfigured router never runs open). With ``protect_reads`` the GETs of ``/narwhal/*`` need it too.
401 = no credential, 403 = wrong credential; both answer a JSON error naming the problem.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable, Mapping

import orjson
from aiohttp import web

from router.config import ConfigError, ControlSettings

PROTECTED_PREFIX = "/narwhal/"
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]


def _error(status: int, message: str, code: str) -> web.Response:
    body = orjson.dumps({"error": {"message": message, "type": "authentication_error", "code": code}})
    headers = {"www-authenticate": 'Bearer realm="narwhal-control"'} if status == 401 else None
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


def control_auth_middleware(
    settings: ControlSettings, environ: Mapping[str, str] | None = None
) -> Middleware | None:
    """The middleware to install, or None when the control plane is open (no ``token_env``)."""
    if not settings.token_env:
        return None
    env = os.environ if environ is None else environ
    token = env.get(settings.token_env, "")
    if not token:
        raise ConfigError(f"control.token_env names {settings.token_env}, which is not set or empty")
    expected = token.encode()

    @web.middleware
    async def control_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith(PROTECTED_PREFIX):
            return await handler(request)
        if request.method in READ_METHODS and not settings.protect_reads:
            return await handler(request)
        header = request.headers.get("authorization", "")
        scheme, _, credential = header.partition(" ")
        if scheme.lower() != "bearer" or not credential.strip():
            return _error(401, "control-plane request needs Authorization: Bearer <token>", "missing_token")
        if not hmac.compare_digest(credential.strip().encode(), expected):
            return _error(403, "control-plane token is not valid", "invalid_token")
        return await handler(request)

    return control_auth
