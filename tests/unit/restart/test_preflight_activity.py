"""The worker's preflight (first activity of every run) against ``httpx.MockTransport`` routers and
engines: what it checks, the one line it fails with, and the fleet identity the lock is keyed on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.preflight import PreflightActivities
from activities.router import LifecycleClient
from activities.worker_config import RouterEntry, WorkerConfig, WorkerSettings
from narwhal_models.restart import (
    PreflightOutcome,
    PreflightRequest,
    RouterRef,
    fleet_identity,
    fleet_lock_id,
)
from tests.unit.restart.test_activities import A, B, example, lifecycle

C = "http://router-c"

ENGINES = {"e0": "http://eng-0:8100", "e1": "http://eng-1:8100", "e2": "http://eng-2:8100"}


def state_doc() -> dict[str, Any]:
    roles = {"e0": "prefill", "e1": "decode", "e2": "decode"}
    return {
        "schema": "narwhal.state", "schema_version": 1,
        "scheduler": {"floors": {"prefill": 1, "decode": 1},
                      "engines": {i: {"role": r, "pin": i == "e2"} for i, r in roles.items()}},
    }  # fmt: skip


def targets() -> list[dict[str, Any]]:
    return [
        {"targets": [u.removeprefix("http://")], "labels": {"iid": i, "__meta_narwhal_url": u}}
        for i, u in ENGINES.items()
    ]


def fleet(
    token: str = "", deny: str = "", dead_engine: str = ""
) -> Callable[[httpx.Request], httpx.Response]:
    def handler(req: httpx.Request) -> httpx.Response:
        host, path = req.url.host, req.url.path
        if host.startswith("eng-"):
            if dead_engine and host == dead_engine:
                raise httpx.ConnectError("refused")
            return httpx.Response(200, text="process_start_time_seconds 1795966339.9\n")
        if host == deny or (token and req.headers.get("authorization") != f"Bearer {token}"):
            return httpx.Response(401, json={"error": "unauthorized"})
        if path == "/narwhal/lifecycle":
            return httpx.Response(200, json=lifecycle(controls=host == "router-b"))
        if path == "/narwhal/handoff":
            return httpx.Response(200, json=example("handoff_initial.json").get("body"))
        if path == "/narwhal/state":
            return httpx.Response(200, json=state_doc())
        if path == "/narwhal/targets":
            return httpx.Response(200, json=targets())
        return httpx.Response(404)

    return handler


def worker_settings(token_env: str = "") -> WorkerSettings:
    """The worker's own configuration: router ``ab`` (A, B; its token from ``token_env``), ``ac``."""
    routers = {"ab": RouterEntry(urls=[A, B], token_env=token_env), "ac": RouterEntry(urls=[A, C])}
    return WorkerSettings.of(WorkerConfig(routers=routers))


async def run(
    handler: Callable[[httpx.Request], httpx.Response],
    ref: RouterRef,
    env: dict[str, str] | None = None,
    token_env: str = "",
) -> PreflightOutcome:
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    acts = PreflightActivities(LifecycleClient(http, worker_settings(token_env), env=env or {}))
    return await ActivityEnvironment().run(acts.preflight, PreflightRequest(router=ref))


async def test_preflight_checks_every_router_and_engine_and_names_the_fleet() -> None:
    out = await run(fleet(token="s3cret"), RouterRef(routers=[A, B]), {"T": "s3cret"}, token_env="T")
    assert out.view.router_url == B and out.view.controls_fleet
    assert out.view.pins == {"e0": False, "e1": False, "e2": True}
    assert out.view.floors == {"prefill": 1, "decode": 1}
    assert out.identity == fleet_identity(ENGINES) and out.lock_id == fleet_lock_id(out.identity)
    assert len(out.checked) == 5  # two routers, three engines
    # the identity is the fleet's, not the request's: the same for another router order
    again = await run(fleet(), RouterRef(routers=[B, A]))
    assert again.identity == out.identity


@pytest.mark.parametrize(
    ("kwargs", "ref", "env", "line"),
    [
        ({}, RouterRef(name="ab"), {},
         "preflight: router ab: control token variable T is not set on the worker"),
        ({"token": "right"}, RouterRef(name="ab"), {"T": "wrong"},
         "preflight: http://router-a/narwhal/lifecycle: HTTP 401 (control token refused)"),
        ({"deny": "router-b"}, RouterRef(routers=[A, B]), {},
         "preflight: http://router-b/narwhal/lifecycle: HTTP 401 (control token refused)"),
        ({"dead_engine": "eng-1"}, RouterRef(routers=[A, B]), {},
         "preflight: engine e1 at http://eng-1:8100 does not answer from the worker (ConnectError)"),
        ({}, RouterRef(routers=[A, C]), {},
         "preflight: none of http://router-a, http://router-c controls the fleet (no lease holder)"),
    ],
)  # fmt: skip
async def test_preflight_fails_with_one_line(
    kwargs: dict[str, str], ref: RouterRef, env: dict[str, str], line: str
) -> None:
    with pytest.raises(ApplicationError) as caught:
        # router ``ab`` named with its token variable T configured; by URLs, without a token
        await run(fleet(**kwargs), ref, env, token_env="T" if ref.name == "ab" else "")
    assert caught.value.type == "PreflightFailed" and caught.value.non_retryable
    assert caught.value.message == line
