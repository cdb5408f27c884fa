"""Control-plane bearer token for /narwhal/* (control.token_env, control.protect_reads)."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from router.config import ConfigError, ControlSettings
from router.lifecycle.auth import control_auth_middleware


async def ok(_: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def client_for(settings: ControlSettings) -> TestClient[web.Request, web.Application]:
    mw = control_auth_middleware(settings, {"NARWHAL_TOKEN": "s3cret"})
    app = web.Application(middlewares=[mw] if mw else [])
    app.router.add_get("/narwhal/lifecycle", ok)
    app.router.add_post("/narwhal/lifecycle/drain", ok)
    app.router.add_post("/v1/completions", ok)
    client: TestClient[web.Request, web.Application] = TestClient(TestServer(app))
    await client.start_server()
    return client


async def test_mutations_need_the_token() -> None:
    c = await client_for(ControlSettings(token_env="NARWHAL_TOKEN"))
    try:
        r = await c.post("/narwhal/lifecycle/drain")
        assert r.status == 401 and "Bearer" in (await r.json())["error"]["message"]
        assert r.headers["www-authenticate"].startswith("Bearer")
        r = await c.post("/narwhal/lifecycle/drain", headers={"authorization": "Bearer nope"})
        assert r.status == 403 and (await r.json())["error"]["code"] == "invalid_token"
        r = await c.post("/narwhal/lifecycle/drain", headers={"authorization": "Bearer s3cret"})
        assert r.status == 200
        assert (await c.get("/narwhal/lifecycle")).status == 200  # reads open by default
        assert (await c.post("/v1/completions")).status == 200  # data plane untouched
    finally:
        await c.close()


async def test_protect_reads() -> None:
    c = await client_for(ControlSettings(token_env="NARWHAL_TOKEN", protect_reads=True))
    try:
        assert (await c.get("/narwhal/lifecycle")).status == 401
        r = await c.get("/narwhal/lifecycle", headers={"authorization": "Bearer s3cret"})
        assert r.status == 200
    finally:
        await c.close()


def test_open_without_token_env_and_fails_closed_when_unset() -> None:
    assert control_auth_middleware(ControlSettings(), {}) is None
    with pytest.raises(ConfigError, match="NARWHAL_TOKEN"):
        control_auth_middleware(ControlSettings(token_env="NARWHAL_TOKEN"), {})
