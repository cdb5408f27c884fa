"""``narwhal-worker`` logging: an activity's per-poll HTTP requests stay below INFO, what changed
(an engine ready to stop) is logged at INFO."""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from temporalio.testing import ActivityEnvironment

from activities.router import LifecycleActivities, LifecycleClient
from activities.worker_config import RouterEntry, WorkerConfig, WorkerSettings
from narwhal_models.restart import StopWaitRequest
from router.logs import CLIENT_LOGGERS
from tests.unit.restart.test_activities import REF, example, lifecycle
from workflows import worker


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    before = {name: logging.getLogger(name).level for name in CLIENT_LOGGERS}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, lvl in before.items():
        logging.getLogger(name).setLevel(lvl)


def _draining_then_drained() -> list[dict[str, Any]]:
    draining = copy.deepcopy(lifecycle())
    draining["engines"]["e0"].update(
        state="draining", draining=True, accepts_new=False, old_process_start=1.0
    )
    return [draining, copy.deepcopy(draining), example("drain_e0.json")["body"]]


async def _wait_ready_to_stop() -> None:
    docs = _draining_then_drained()

    def router(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=docs.pop(0) if len(docs) > 1 else docs[0])

    async with httpx.AsyncClient(transport=httpx.MockTransport(router)) as http:
        config = WorkerConfig(routers={"ab": RouterEntry(urls=REF.routers)})
        acts = LifecycleActivities(LifecycleClient(http, WorkerSettings.of(config), env={}))
        req = StopWaitRequest(router=REF, engines=["e0"], poll_interval_s=0.01)
        out = await ActivityEnvironment().run(acts.wait_ready_to_stop, req)
    assert out.status == "ready_to_stop"


def _client_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name in CLIENT_LOGGERS]


async def test_polls_are_not_logged_at_info_but_the_change_is(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    worker.setup_logging("INFO")  # what narwhal-worker does at start (default --log-level)
    await _wait_ready_to_stop()
    assert _client_lines(caplog) == []  # three polls of the router, none of them at INFO
    changes = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(m.startswith("['e0'] ready to stop after 3 polls") for m in changes), changes


async def test_the_polls_are_there_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    worker.setup_logging("DEBUG")
    await _wait_ready_to_stop()
    polls = [
        m
        for m in _client_lines(caplog)
        if m.startswith("HTTP Request: GET http://router-a/narwhal/lifecycle")
    ]
    assert len(polls) == 3
