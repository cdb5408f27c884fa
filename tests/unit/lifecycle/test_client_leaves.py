"""A client that leaves mid-readmit must not strand the engine in ``validating``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import httpx
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from router.core import RouterCore
from router.engines.control import EngineControl
from router.journal import Journal
from router.lifecycle.service import LifecycleService

from .fake_engines import FakeFleet
from .helpers import fleet


async def _until(predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(5.0):
        while not predicate():  # noqa: ASYNC110 - polls state owned by the service
            await asyncio.sleep(0.01)


async def test_readmit_finishes_after_the_client_disconnects() -> None:
    fake = FakeFleet(3)
    gate = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/completions":
            await gate.wait()  # generation check hangs until the client has gone
        return fake.handle(request)

    core = RouterCore(config=fleet(contract=True), journal=Journal(None))
    service = LifecycleService(core, control=EngineControl(core.config, httpx.MockTransport(handler)))
    service.machine.process_starts = {i: e.start for i, e in fake.engines.items()}
    app = web.Application()
    service.add_routes(app)
    client: TestClient[web.Request, web.Application] = TestClient(TestServer(app, handler_cancellation=True))
    await client.start_server()
    try:
        r = await client.post("/narwhal/lifecycle/drain", json={"engines": ["e1"], "deadline_s": 5})
        assert r.status == 200
        fake.engines["e1"].restart()
        leaving = asyncio.create_task(client.post("/narwhal/lifecycle/readmit", json={"engines": ["e1"]}))
        await _until(lambda: service.machine.records["e1"].state == "validating")
        leaving.cancel()  # the operator's tool gives up: the connection closes mid-validation
        with contextlib.suppress(asyncio.CancelledError):
            await leaving
        await asyncio.sleep(0.05)
        gate.set()
        await _until(lambda: service.machine.records["e1"].state != "validating")
        record = service.machine.records["e1"]
        assert record.state == "active", record.error
        assert "new process identity" in record.checks
        assert "e1" not in core.scheduler.draining
        r = await client.get("/narwhal/lifecycle")
        assert (await r.json())["engines"]["e1"]["accepts_new"] is True
    finally:
        gate.set()
        await client.close()
