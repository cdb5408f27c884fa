"""One engine-control client per router: the breaker's recovery probe, the lifecycle's checks and the
context-length reader share ``assemble``'s ``EngineControl``; the recovery probe's requests (health,
then a direct 1-token generation) go through it and its answer decides the readmission."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import orjson

from router.assemble import RouterOptions, assemble, build_parts
from router.breaker import Breaker
from router.clock import FakeClock
from router.config import parse_fleet
from router.core import RouterCore
from router.engines.control import EngineControl
from router.engines.legs import EngineClient
from router.journal import Journal
from router.probes import Prober

FLEET = {
    "model": "m",
    "engines": [
        {"iid": "p0", "url": "http://p0", "role": "prefill"},
        {"iid": "d0", "url": "http://d0"},
        {"iid": "d1", "url": "http://d1"},
    ],
}


def _core() -> RouterCore:
    return RouterCore(config=parse_fleet(FLEET), journal=Journal(None), clock=FakeClock())


async def _until(predicate: Callable[[], bool]) -> None:
    for _ in range(10_000):  # in-memory transport: a few loop iterations per request
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("state not reached")


def test_assembled_router_has_one_engine_control_client() -> None:
    router = assemble(parse_fleet(FLEET), RouterOptions(), clock=FakeClock())
    control = router.parts.control
    assert router.parts.prober.control is control
    assert router.lifecycle.control is control
    assert router.context.control is control
    assert sum(isinstance(c, EngineControl) for c in router.components()) == 1


def test_build_parts_prober_uses_the_parts_control_client() -> None:
    parts = build_parts(_core(), RouterOptions())
    assert parts.prober.control is parts.control


async def _recovery(generation_status: int) -> tuple[bool, list[tuple[str, str, str]]]:
    seen: list[tuple[str, str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, str(request.url), request.headers.get("x-request-id", "")))
        if request.url.path == "/health":
            return httpx.Response(200)
        doc = {"choices": [{"text": "x"}]} if generation_status == 200 else {"error": {"message": "no"}}
        return httpx.Response(generation_status, content=orjson.dumps(doc))

    clock = FakeClock()
    core = RouterCore(config=parse_fleet(FLEET), journal=Journal(None), clock=clock)
    breaker = Breaker(core.scheduler, core.clock, 3, emit=core.journal.append)
    control = EngineControl(core.config, httpx.MockTransport(handler))
    prober = Prober(core, breaker, EngineClient(core.config), control, interval_s=5.0)
    await control.start()
    try:
        breaker.eject("d0", "connection")
        assert "d0" in core.scheduler.ejected
        clock.advance(5.0)  # the recovery probe is due
        prober.pass_once()
        await _until(lambda: len(seen) == 2 and "d0" not in breaker.probing)
    finally:
        await prober.stop()
        await control.stop()
    return "d0" not in core.scheduler.ejected, seen


async def test_recovery_probe_readmits_through_the_control_client() -> None:
    readmitted, seen = await _recovery(200)
    assert readmitted
    assert seen == [
        ("GET", "http://d0/health", ""),
        ("POST", "http://d0/v1/completions", "narwhal-probe"),
    ]


async def test_recovery_probe_keeps_an_engine_out_whose_generation_fails() -> None:
    readmitted, seen = await _recovery(500)
    assert not readmitted
    assert [s[1] for s in seen] == ["http://d0/health", "http://d0/v1/completions"]
