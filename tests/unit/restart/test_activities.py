"""Activities against ``httpx.MockTransport`` routers: lease following, idempotency, error taxonomy."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.router import LifecycleActivities, LifecycleClient, parse_lifecycle
from activities.supervisor import SupervisorActivities, parse_process_start
from activities.worker_config import CommandTemplate, RouterEntry, WorkerConfig, WorkerSettings
from narwhal_models.restart import (
    ConfirmRequest,
    DrainRequest,
    EngineTarget,
    ReadmitRequest,
    RouterRef,
    StopWaitRequest,
    SupervisorRef,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "fixtures" / "peer_examples"
A, B = "http://router-a", "http://router-b"
T = "http://router-t"  # the configured router with a token
REF = RouterRef(routers=[A, B])


def settings(token_env: str = "", **templates: CommandTemplate) -> WorkerSettings:
    """The worker's configuration of these tests: router ``ab`` (A, B), ``a`` (T), templates."""
    routers = {"ab": RouterEntry(urls=[A, B]), "a": RouterEntry(urls=[T], token_env=token_env)}
    return WorkerSettings.of(WorkerConfig(routers=routers, templates=templates))


def example(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((EXAMPLES / name).read_text())
    return doc


def lifecycle(controls: bool = True, base: str = "lifecycle_initial.json") -> dict[str, Any]:
    doc = copy.deepcopy(example(base))
    doc = doc.get("body", doc)
    doc["router"]["controls_fleet"] = controls
    return doc


def not_controlling() -> dict[str, Any]:
    doc = lifecycle(controls=False)
    doc["error"] = "this router does not control the fleet"
    return doc


Handler = Callable[[httpx.Request], httpx.Response]


def activities(
    handler: Handler, env: dict[str, str] | None = None, token_env: str = ""
) -> tuple[LifecycleActivities, list[str]]:
    seen: list[str] = []

    def record(req: httpx.Request) -> httpx.Response:
        seen.append(f"{req.method} {req.url.host} {req.url.path}")
        return handler(req)

    http = httpx.AsyncClient(transport=httpx.MockTransport(record))
    return LifecycleActivities(LifecycleClient(http, settings(token_env), env=env or {})), seen


def test_parse_lifecycle_examples() -> None:
    view = parse_lifecycle(example("drain_e0.json")["body"], A)
    assert view.engines["e0"].ready_to_stop and view.engines["e0"].old_process_start == 1795966339.9004564
    wave = parse_lifecycle(example("wave_drain.json")["body"])
    assert wave.wave_active and wave.wave_ready_to_stop and wave.wave_id.startswith("wave-")


async def test_follows_the_lease_holder_on_503_and_connection_errors() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.host == "router-a":
            if req.method == "POST":
                return httpx.Response(503, json=not_controlling())
            return httpx.Response(200, json=lifecycle(controls=False))
        if req.method == "POST":
            return httpx.Response(200, json=example("drain_e0.json")["body"])
        return httpx.Response(200, json=lifecycle())

    acts, seen = activities(handler)
    out = await ActivityEnvironment().run(acts.drain, DrainRequest(router=REF, engines=["e0"]))
    assert out.engines["e0"].old_process_start == 1795966339.9004564
    assert seen[-1] == "POST router-b /narwhal/lifecycle/drain"
    assert "POST router-a /narwhal/lifecycle/drain" not in seen  # discovery found b first

    # the cached holder dies: next call goes back through discovery
    def handler2(req: httpx.Request) -> httpx.Response:
        if req.url.host == "router-b":
            raise httpx.ConnectError("refused")
        if req.method == "POST":
            return httpx.Response(200, json=example("drain_e0.json")["body"])
        return httpx.Response(200, json=lifecycle())

    acts.client.http = httpx.AsyncClient(transport=httpx.MockTransport(handler2))
    out = await ActivityEnvironment().run(acts.drain, DrainRequest(router=REF, engines=["e0"]))
    assert out.engines["e0"].state == "drained"


async def test_any_active_active_replica_leads_to_the_holder_among_the_configured_urls() -> None:
    def follower_doc() -> dict[str, Any]:
        doc = not_controlling()
        doc["replicas"] = {"mode": "active-active", "self_id": "r1", "holder_id": "r0",
                           "holder_url": "http://router-b/", "version": 7, "members": []}  # fmt: skip
        return doc

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.host == "router-a":  # a replica that serves but does not control
            return httpx.Response(503 if req.method == "POST" else 200, json=follower_doc())
        if req.method == "POST":
            return httpx.Response(200, json=example("drain_e0.json")["body"])
        return httpx.Response(200, json=lifecycle())

    acts, seen = activities(handler)
    ref = RouterRef(routers=[A])
    out = await ActivityEnvironment().run(acts.drain, DrainRequest(router=ref, engines=["e0"]))
    assert out.engines["e0"].state == "drained"
    assert seen == [
        "GET router-a /narwhal/lifecycle",
        "GET router-b /narwhal/lifecycle",  # the worker's configuration lists every replica
        "POST router-b /narwhal/lifecycle/drain",
    ]


async def test_preflight_also_follows_the_holder_an_active_active_replica_names() -> None:
    from workflows.preflight import find_holder

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.host == "router-a":
            doc = lifecycle(controls=False)
            doc["replicas"] = {"mode": "active-active", "self_id": "r1", "holder_id": "r0",
                               "holder_url": "http://router-h:9000", "version": 3, "members": []}  # fmt: skip
            return httpx.Response(200, json=doc)
        if req.url.path == "/narwhal/handoff":
            return httpx.Response(404)
        return httpx.Response(200, json=lifecycle())

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        view = await find_holder(http, [A], "")
    assert view.controls_fleet and view.router_url == "http://router-h:9000"


async def test_no_holder_is_a_retryable_router_unavailable() -> None:
    acts, _ = activities(lambda req: httpx.Response(200, json=lifecycle(controls=False)))
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(acts.read_fleet, REF)
    assert err.value.type == "RouterUnavailable" and not err.value.non_retryable


async def test_control_token_comes_from_the_workers_configuration() -> None:
    auth: list[str | None] = []

    def handler(req: httpx.Request) -> httpx.Response:
        auth.append(req.headers.get("authorization"))
        return httpx.Response(200, json=lifecycle())

    acts, _ = activities(handler, env={"NARWHAL_TOKEN": "s3cret"}, token_env="NARWHAL_TOKEN")
    await ActivityEnvironment().run(acts.read_fleet, RouterRef(name="a"))
    assert auth[0] == "Bearer s3cret"
    await ActivityEnvironment().run(acts.read_fleet, RouterRef(routers=[T]))  # URLs of router "a"
    assert auth[-1] == "Bearer s3cret"
    acts401, _ = activities(
        lambda req: httpx.Response(401, json={}), env={"NARWHAL_TOKEN": "bad"}, token_env="NARWHAL_TOKEN"
    )
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(acts401.read_fleet, RouterRef(name="a"))
    assert err.value.type == "Unauthorized" and err.value.non_retryable


@pytest.mark.parametrize(
    ("ref", "why"),
    [
        (RouterRef(name="elsewhere"), "router 'elsewhere' is not in this worker's configuration"),
        (RouterRef(routers=["http://listener:9"]), "are not in this worker's configuration"),
        (RouterRef(name="a", routers=["http://listener:9"]), "not configured for router a"),
        (RouterRef(name="a", token_env="OTHER_SECRET"), "names a token variable"),
    ],
)
async def test_a_router_or_token_the_worker_does_not_know_is_refused_before_any_request(
    ref: RouterRef, why: str
) -> None:
    acts, seen = activities(
        lambda req: httpx.Response(200, json=lifecycle()), env={"T": "s3cret"}, token_env="T"
    )
    for call in (
        ActivityEnvironment().run(acts.read_fleet, ref),
        ActivityEnvironment().run(acts.drain, DrainRequest(router=ref, engines=["e0"])),
    ):
        with pytest.raises(ApplicationError, match=why) as err:
            await call
        assert err.value.type == "WorkerRefused" and err.value.non_retryable
    assert seen == []  # nothing was asked of any router, no token went anywhere


async def test_a_holder_named_outside_the_configured_urls_is_not_followed() -> None:
    """An active-active replica's document names the holder; the token goes only to configured URLs."""

    def handler(req: httpx.Request) -> httpx.Response:
        doc = lifecycle(controls=False)
        doc["replicas"] = {"holder_url": "http://listener:9"}
        return httpx.Response(200, json=doc)

    acts, seen = activities(handler, env={"T": "s3cret"}, token_env="T")
    with pytest.raises(ApplicationError, match="names holder http://listener:9, not a URL of router a"):
        await ActivityEnvironment().run(acts.read_fleet, RouterRef(name="a"))
    assert all(" listener " not in s for s in seen), seen


async def test_drain_refuses_bad_engine_ids_and_unknown_templates_before_draining() -> None:
    acts, seen = activities(lambda req: httpx.Response(200, json=lifecycle()))
    bad = DrainRequest(router=REF, engines=["x{url}"])
    with pytest.raises(ApplicationError, match=re.escape("engine id 'x{url}' refused")) as err:
        await ActivityEnvironment().run(acts.drain, bad)
    assert err.value.type == "WorkerRefused"
    for sup, why in (
        (SupervisorRef(backend="command", template="nope"), "template 'nope' is not in this worker's"),
        (SupervisorRef(backend="command", command="touch /tmp/x"), "workflow input carries a command"),
    ):
        with pytest.raises(ApplicationError, match=why):
            await ActivityEnvironment().run(
                acts.drain, DrainRequest(router=REF, engines=["e0"], supervisor=sup)
            )
    assert seen == []


async def test_retried_drain_meeting_already_active_is_success() -> None:
    held = example("drain_e0.json")["body"]

    def handler(req: httpx.Request) -> httpx.Response:
        if req.method == "POST":
            return httpx.Response(409, json={**held, "error": "lifecycle action already active for e0"})
        return httpx.Response(200, json=held)

    acts, _ = activities(handler)
    out = await ActivityEnvironment().run(acts.drain, DrainRequest(router=REF, engines=["e0"]))
    assert out.already_active and out.engines["e0"].old_process_start == 1795966339.9004564


async def test_unsafe_drain_is_non_retryable() -> None:
    doc = {**lifecycle(), "error": "the last schedulable engine requires a whole-wave drain"}

    def handler(req: httpx.Request) -> httpx.Response:
        return (
            httpx.Response(409, json=doc) if req.method == "POST" else httpx.Response(200, json=lifecycle())
        )

    acts, _ = activities(handler)
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(acts.drain, DrainRequest(router=REF, engines=["e0"]))
    assert err.value.type == "UnsafeRequest" and err.value.non_retryable
    assert "last schedulable" in str(err.value)


async def test_drain_capture_failure_is_reported_for_a_repeat() -> None:
    fail = example("wave_drain_capture_fail.json")

    def handler(req: httpx.Request) -> httpx.Response:
        if req.method == "POST":
            return httpx.Response(fail["http_status"], json=fail["body"])
        return httpx.Response(200, json=lifecycle())

    acts, _ = activities(handler)
    out = await ActivityEnvironment().run(
        acts.drain, DrainRequest(router=REF, engines=["e0", "e1", "e2"], wave=True)
    )
    assert out.capture_failures == {"e2": "process identity unreadable: ConnectError"}


async def test_readmit_refusal_is_validation_failed_with_per_engine_details() -> None:
    refused = example("readmit_e0_norestart.json")

    def handler(req: httpx.Request) -> httpx.Response:
        if req.method == "POST":
            return httpx.Response(refused["http_status"], json=refused["body"])
        return httpx.Response(200, json=lifecycle())

    acts, _ = activities(handler)
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(
            acts.readmit,
            ReadmitRequest(router=REF, engines=["e0"], old_process_starts={"e0": 1795966339.9004564}),
        )
    assert err.value.type == "ValidationFailed" and err.value.non_retryable
    assert err.value.details[0]["engines"]["e0"]["error"] == "engine process did not restart after drain"


async def test_retried_readmit_of_an_already_active_engine_is_success() -> None:
    done = example("readmit_e0.json")["body"]

    def handler(req: httpx.Request) -> httpx.Response:
        if req.method == "POST":
            return httpx.Response(409, json={**done, "error": "e0 is active, expected drained"})
        return httpx.Response(200, json=done)

    acts, _ = activities(handler)
    req = ReadmitRequest(router=REF, engines=["e0"], old_process_starts={"e0": 1795966339.9004564})
    out = await ActivityEnvironment().run(acts.readmit, req)
    assert out.already_active and out.engines["e0"].new_process_start == 1795966383.454368
    # ... but not when the recorded new start is not newer than this drain's record
    stale = req.model_copy(update={"old_process_starts": {"e0": 1795966400.0}})
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(acts.readmit, stale)
    assert err.value.type == "ValidationFailed"


async def test_wait_ready_to_stop_heartbeats_until_drained() -> None:
    docs = [lifecycle(), lifecycle(), example("drain_e0.json")["body"]]
    draining = copy.deepcopy(docs[0])
    draining["engines"]["e0"].update(
        state="draining", draining=True, accepts_new=False, old_process_start=1.0
    )
    draining["engines"]["e0"]["resident"]["decode"] = 2
    docs[0] = docs[1] = draining

    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=docs.pop(0) if len(docs) > 1 else docs[0])

    acts, _ = activities(handler)
    env = ActivityEnvironment()
    beats: list[Any] = []
    env.on_heartbeat = lambda *d: beats.append(d[0])
    out = await env.run(
        acts.wait_ready_to_stop, StopWaitRequest(router=REF, engines=["e0"], poll_interval_s=0.01)
    )
    assert out.status == "ready_to_stop"
    assert [b["resident"]["e0"] for b in beats] == [2, 2]

    late = copy.deepcopy(draining)
    late["engines"]["e0"].update(
        state="deadline_exceeded", error="2 resident request(s) remain after the drain deadline"
    )
    acts2, _ = activities(lambda req: httpx.Response(200, json=late))
    out = await ActivityEnvironment().run(
        acts2.wait_ready_to_stop, StopWaitRequest(router=REF, engines=["e0"])
    )
    assert out.status == "deadline_exceeded" and "resident" in out.message


async def test_confirm_active_polls_by_retry() -> None:
    held = example("drain_e0.json")["body"]
    acts, _ = activities(lambda req: httpx.Response(200, json=held))
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(acts.confirm_active, ConfirmRequest(router=REF, engines=["e0"]))
    assert err.value.type == "NotReadyYet" and not err.value.non_retryable
    ok = example("readmit_e0.json")["body"]

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/ready":
            return httpx.Response(503, json={"status": "not_ready", "reason": "whole-wave drain wave-x"})
        return httpx.Response(200, json=ok)

    acts2, _ = activities(handler)
    await ActivityEnvironment().run(acts2.confirm_active, ConfirmRequest(router=REF, engines=["e0"]))
    with pytest.raises(ApplicationError, match="whole-wave drain"):
        await ActivityEnvironment().run(
            acts2.confirm_active, ConfirmRequest(router=REF, engines=["e0"], require_ready=True)
        )


# -- supervisor backends --------------------------------------------------------------------------


def sup_acts(
    handler: Handler, env: dict[str, str] | None = None, **templates: CommandTemplate
) -> SupervisorActivities:
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return SupervisorActivities(http, settings(**templates), env=env if env is not None else dict(os.environ))


def metrics(start: float) -> httpx.Response:
    return httpx.Response(200, text=f"# HELP x\nprocess_start_time_seconds {start}\nother 1\n")


def test_parse_process_start() -> None:
    assert parse_process_start("a 1\nprocess_start_time_seconds 1795966339.9004564\n") == 1795966339.9004564
    assert parse_process_start("nothing here") is None


async def test_local_backend_always_sends_the_drain_recorded_start() -> None:
    bodies: list[Any] = []

    def handler(req: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(req.content))
        return httpx.Response(
            200, json={"iid": "e0", "restarted": len(bodies) == 1, "old_pid": 1, "new_pid": 2}
        )

    acts = sup_acts(handler)
    target = EngineTarget(
        iid="e0", old_process_start=123.5, supervisor=SupervisorRef(backend="local", url="http://sup")
    )
    first = await ActivityEnvironment().run(acts.restart_engine, target)
    again = await ActivityEnvironment().run(acts.restart_engine, target)  # a retried activity
    assert first.restarted and not again.restarted
    assert bodies == [{"if_process_start": 123.5}, {"if_process_start": 123.5}]


async def test_command_backend_runs_once_and_is_guarded(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    live = {"start": 100.0}
    cmd = f"{sys.executable} -c \"open('{marker}', 'a').write('{{iid}}\\n')\""
    acts = sup_acts(
        lambda req: metrics(live["start"]),
        restart=CommandTemplate(command=cmd),
        fails=CommandTemplate(command="sh -c 'exit 3'"),
    )
    target = EngineTarget(
        iid="e0",
        url="http://e0",
        old_process_start=100.0,
        supervisor=SupervisorRef(backend="command"),
    )
    out = await ActivityEnvironment().run(acts.restart_engine, target)
    assert out.restarted and marker.read_text() == "e0\n"
    live["start"] = 200.0  # the engine now serves a new process: a retry must not run the command
    out = await ActivityEnvironment().run(acts.restart_engine, target)
    assert not out.restarted and marker.read_text() == "e0\n"
    failing = target.model_copy(update={"supervisor": SupervisorRef(backend="command", template="fails")})
    live["start"] = 100.0
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(acts.restart_engine, failing)
    assert err.value.type == "RestartCommandFailed" and err.value.non_retryable


async def test_a_command_that_leaves_a_daemon_behind_completes_at_its_exit(tmp_path: Path) -> None:
    pid_file = tmp_path / "daemon.pid"
    # the daemon inherits the command's stdout/stderr and outlives it (as `service x start` may)
    cmd = f"sleep 60 & echo $! > {pid_file}; echo started"
    acts = sup_acts(
        lambda req: metrics(100.0),
        restart=CommandTemplate(command=cmd, shell=True),
        full=CommandTemplate(command="echo no space left >&2; exit 4", shell=True),
    )
    target = EngineTarget(
        iid="e0",
        url="http://e0",
        old_process_start=100.0,
        supervisor=SupervisorRef(backend="command"),
    )
    try:
        out = await asyncio.wait_for(ActivityEnvironment().run(acts.restart_engine, target), 20)
        assert out.restarted
    finally:
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
    failing = target.model_copy(update={"supervisor": SupervisorRef(backend="command", template="full")})
    with pytest.raises(ApplicationError, match="exited 4: no space left"):
        await ActivityEnvironment().run(acts.restart_engine, failing)


async def test_manual_backend_and_new_process_wait() -> None:
    live = {"start": 100.0}
    acts = sup_acts(lambda req: metrics(live["start"]))
    target = EngineTarget(
        iid="e0", url="http://e0", old_process_start=100.0, supervisor=SupervisorRef(backend="manual")
    )
    out = await ActivityEnvironment().run(acts.restart_engine, target)
    assert not out.restarted and "manual" in out.note
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(acts.wait_new_process, target)
    assert err.value.type == "NotReadyYet"
    live["start"] = 150.0
    assert (await ActivityEnvironment().run(acts.wait_new_process, target)).process_start == 150.0
