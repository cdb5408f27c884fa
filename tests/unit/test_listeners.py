"""Control listener: address rules (fleet file + flags) and the per-listener route split, in-process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from router.assemble import RouterOptions, build_router
from router.config import ConfigError, parse_fleet
from router.listeners import ControlListener, control_listener, listener_middleware, start_control_site
from tests.support.procs import free_port


def cfg(**control: Any) -> Any:
    return parse_fleet(
        {"model": "m", "engines": [{"iid": "e0", "url": "http://e0.test"}], "control": control}
    )


def test_no_control_listener_by_default() -> None:
    assert control_listener(cfg(), RouterOptions()) is None


def test_fleet_file_and_flags() -> None:
    opts = RouterOptions(host="0.0.0.0", port=8000)
    assert control_listener(cfg(port=9000), opts) == ControlListener("0.0.0.0", 9000)  # host: --host
    assert control_listener(cfg(port=9000, host="10.0.0.1"), opts) == ControlListener("10.0.0.1", 9000)
    flags = RouterOptions(port=8000, control_host="127.0.0.2", control_port=9100)
    assert control_listener(cfg(port=9000, host="10.0.0.1"), flags) == ControlListener("127.0.0.2", 9100)
    assert control_listener(cfg(port=9000), RouterOptions(control_port=0)) is None  # flag 0 turns it off
    assert ControlListener("::1", 9000).url == "http://[::1]:9000"


def test_unusable_addresses_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="distinct ports"):
        control_listener(cfg(port=8000), RouterOptions(port=8000))
    with pytest.raises(ConfigError, match="needs a control port"):
        control_listener(cfg(), RouterOptions(control_host="127.0.0.1"))
    with pytest.raises(ConfigError, match="not a TCP port"):
        control_listener(cfg(), RouterOptions(control_port=70000))
    with pytest.raises(ConfigError, match="distinct ports"):  # build_router fails: narwhal-serve exit 2
        build_router(cfg(port=8000), RouterOptions(port=8000))


async def ok(request: web.Request) -> web.Response:
    return web.json_response({"path": request.path})


@pytest.fixture
async def two_listeners() -> AsyncIterator[tuple[str, str]]:
    client_port, control_port = free_port(), free_port()
    app = web.Application(middlewares=[listener_middleware(control_port)])
    for path in ("/health", "/ready", "/metrics", "/v1/models", "/narwhal/lifecycle"):
        app.router.add_get(path, ok)
    app.router.add_post("/v1/completions", ok)
    app.router.add_post("/narwhal/lifecycle/drain", ok)
    app.router.add_get("/narwhal/items/{name}", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", client_port).start()
    options = RouterOptions(host="127.0.0.1", port=client_port)
    assert await start_control_site(runner, cfg(port=control_port), options) is not None
    try:
        yield f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{control_port}"
    finally:
        await runner.cleanup()


async def test_routes_are_split_by_listener(two_listeners: tuple[str, str]) -> None:
    client, control = two_listeners
    async with httpx.AsyncClient(timeout=5) as h:
        for path in ("/health", "/ready", "/metrics", "/v1/models"):
            assert (await h.get(client + path)).status_code == 200
        assert (await h.post(client + "/v1/completions")).status_code == 200
        for path in ("/narwhal/lifecycle", "/narwhal/items/x", "/narwhal/unknown", "/narwhal"):
            r = await h.get(client + path)
            assert r.status_code == 404 and r.json()["error"]["code"] == "control_listener_only", path
        r = await h.post(client + "/narwhal/lifecycle/drain")
        assert r.json()["error"]["message"] == "control API is served on the control listener"

        for path in ("/health", "/ready", "/metrics", "/narwhal/lifecycle", "/narwhal/items/x"):
            assert (await h.get(control + path)).status_code == 200, path
        assert (await h.post(control + "/narwhal/lifecycle/drain")).status_code == 200
        for method, path in (("POST", "/v1/completions"), ("GET", "/v1/models"), ("GET", "/nope")):
            r = await h.request(method, control + path)
            assert r.status_code == 404 and r.json()["error"]["type"] == "not_found", path


@pytest.mark.parametrize(
    ("host", "control", "token", "warns"),
    [
        ("0.0.0.0", {}, "", True),
        ("10.1.2.3", {}, "", True),
        ("router.example", {}, "", True),
        ("127.0.0.1", {}, "", False),
        ("::1", {}, "", False),
        ("localhost", {}, "", False),
        ("0.0.0.0", {"token_env": "TOKEN"}, "TOKEN", False),
        ("0.0.0.0", {"port": 9100, "host": "127.0.0.1"}, "", False),
        ("127.0.0.1", {"port": 9100, "host": "0.0.0.0"}, "", True),
    ],
)
def test_open_control_plane_on_a_non_loopback_address_warns(
    host: str, control: dict[str, object], token: str, warns: bool
) -> None:
    from router.config import parse_fleet
    from router.listeners import open_control_warning

    fleet = parse_fleet(
        {"model": "m", "engines": [{"iid": "e0", "url": "http://e0.test"}], "control": control}
    )
    text = open_control_warning(fleet, RouterOptions(host=host, port=8000))
    assert bool(text) is warns, text
    if warns:
        assert text.startswith("control plane is open: /narwhal/*") and "control.token_env" in text
