"""Preflight of ``narwhal-restart start`` against ``httpx.MockTransport`` routers: engine addresses
from ``GET /narwhal/targets`` / ``--fleet-file`` / ``--engine-url``, role safety failing closed, and
the activities' pydantic view of the router's documents (peer examples parse; bad ones fail loudly)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.exceptions import ApplicationError

from activities.documents import DocumentError, handoff_roles, lifecycle_document, target_urls
from activities.router import parse_lifecycle
from narwhal_models.restart import FleetView
from workflows.preflight import PreflightError, StartRequest, preflight
from workflows.restart import pick_batch

EXAMPLES = Path(__file__).resolve().parents[2] / "fixtures" / "peer_examples"
R = "http://router-a"
# The peer's (Narwhal 0.7.0) target list: one HTTP-SD group per engine, the engine id as a label.
TARGETS = [
    {"targets": ["127.0.0.1:9001"], "labels": {"iid": "e0", "role": "prefill"}},
    {"targets": ["127.0.0.1:9002"], "labels": {"iid": "e1", "role": "decode"}},
    {"targets": ["127.0.0.1:9003"], "labels": {"iid": "e2", "role": "decode"}},
]


def example(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((EXAMPLES / name).read_text())
    return doc


def router(
    handoff: Any = None, targets: Any = None, handoff_status: int = 200, targets_status: int = 200
) -> Callable[[httpx.Request], httpx.Response]:
    def handle(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/narwhal/lifecycle":
            return httpx.Response(200, json=example("lifecycle_initial.json"))
        if req.url.path == "/narwhal/handoff":
            body = example("handoff_initial.json") if handoff is None else handoff
            return httpx.Response(handoff_status, json=body)
        if req.url.path == "/narwhal/targets":
            return httpx.Response(targets_status, json=TARGETS if targets is None else targets)
        return httpx.Response(404, json={"error": "not found"})

    return handle


async def run(handler: Callable[[httpx.Request], httpx.Response], **kw: Any) -> Any:
    req = StartRequest(
        routers=[R], supervisor=kw.pop("supervisor", "command"), restart_template="restart", **kw
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        return await preflight(http, req)


async def test_engine_urls_come_from_the_routers_targets_without_flags() -> None:
    pre = await run(router())
    assert pre.engine_urls == {
        "e0": "http://127.0.0.1:9001",
        "e1": "http://127.0.0.1:9002",
        "e2": "http://127.0.0.1:9003",
    }
    assert pre.view.roles == {"e0": "prefill", "e1": "decode", "e2": "decode"}


async def test_engine_url_overrides_and_scheme_label() -> None:
    targets = copy.deepcopy(TARGETS)
    targets[1]["labels"]["__scheme__"] = "https"
    pre = await run(router(targets=targets), engine_urls={"e2": "http://10.0.0.9:8000/"})
    assert pre.engine_urls["e1"] == "https://127.0.0.1:9002"
    assert pre.engine_urls["e2"] == "http://10.0.0.9:8000"


async def test_fleet_file_instead_of_the_router(tmp_path: Path) -> None:
    fleet = {
        "schema": "narwhal.fleet", "schema_version": 2, "model": "fake",
        "engines": [{"iid": f"e{i}", "url": f"http://h{i}:8000/", "role": "decode"} for i in range(3)],
    }  # fmt: skip
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(fleet))
    pre = await run(router(targets_status=404), fleet_file=str(path))
    assert pre.engine_urls == {f"e{i}": f"http://h{i}:8000" for i in range(3)}
    path.write_text('{"engines": [{"iid": "e0"}]}')
    with pytest.raises(
        PreflightError, match=r"fleet\.json: not a fleet file.*engines\.0\.url: Field required"
    ):
        await run(router(), fleet_file=str(path))
    with pytest.raises(PreflightError, match="No such file"):
        await run(router(), fleet_file=str(tmp_path / "missing.json"))


async def test_a_router_without_targets_names_the_flags() -> None:
    with pytest.raises(PreflightError) as err:
        await run(router(targets_status=404))
    msg = str(err.value)
    assert "no URL for engine(s) e0, e1, e2" in msg and "/narwhal/targets answered HTTP 404" in msg
    assert "--fleet-file PATH or --engine-url IID=URL" in msg


async def test_an_ambiguous_target_list_is_refused_loudly() -> None:
    with pytest.raises(PreflightError, match="no engine id label"):
        await run(router(targets=[{"targets": ["127.0.0.1:9001"], "labels": {}}]))
    with pytest.raises(PreflightError, match="lists 2 targets"):
        await run(router(targets=[{"targets": ["a:1", "b:2"], "labels": {"iid": "e0"}}]))
    with pytest.raises(PreflightError, match=r"not a Prometheus HTTP-SD target list: 0\.targets"):
        await run(router(targets=[{"labels": {"iid": "e0"}}]))


@pytest.mark.parametrize(
    ("handoff", "status", "why"),
    [
        (None, 500, "answered HTTP 500"),
        ({"schema": "narwhal.handoff"}, 200, "schema_version: Field required"),
        ("roles-missing", 200, "roles: Field required"),
        ("role-odd", 200, "e1=both"),
    ],
)
async def test_role_safety_fails_closed_when_roles_are_unknown(handoff: Any, status: int, why: str) -> None:
    if handoff == "roles-missing":
        handoff = {k: v for k, v in example("handoff_initial.json").items() if k != "roles"}
    elif handoff == "role-odd":
        handoff = example("handoff_initial.json")
        handoff["roles"]["e1"] = "both"
    with pytest.raises(PreflightError) as err:
        await run(router(handoff=handoff, handoff_status=status))
    assert "role safety: cannot tell which engines serve prefill and decode" in str(err.value)
    assert why in str(err.value)
    # a whole-wave restart drains everything anyway: roles do not matter there
    pre = await run(router(handoff=handoff, handoff_status=status), mode="wave")
    assert pre.mode == "wave"


def test_pick_batch_refuses_without_roles() -> None:
    view = parse_lifecycle(example("lifecycle_initial.json"), R)
    assert pick_batch(["e1"], view, 1) == (
        [],
        "role safety: unknown role for e0=(missing), e1=(missing), e2=(missing) in /narwhal/handoff",
    )
    broken = view.model_copy(update={"roles_error": "http://r/narwhal/handoff answered HTTP 503"})
    batch, why = pick_batch(["e1"], broken, 1)
    assert batch == [] and "answered HTTP 503" in why
    ok = view.model_copy(update={"roles": {"e0": "prefill", "e1": "decode", "e2": "decode"}})
    assert pick_batch(["e1"], ok, 1) == (["e1"], "")
    assert pick_batch(["e0"], ok, 1) == ([], "e0 is the last eligible prefill engine")


# -- the documents ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    sorted(
        p.name for p in EXAMPLES.glob("*.json") if "attestation" not in p.name and "handoff" not in p.name
    ),
)
def test_every_peer_lifecycle_example_parses(name: str) -> None:
    doc = example(name)
    doc = doc.get("body", doc)
    d = lifecycle_document(doc)
    assert set(d.engines) == {"e0", "e1", "e2"}


def test_peer_handoff_examples_parse() -> None:
    for name in ("handoff_initial.json", "handoff_after_resume.json"):
        h = handoff_roles(example(name))
        assert set(h.roles) == {"e0", "e1", "e2"} and h.unknown_roles(h.engines) == {}


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("engines", "e0", "accepts_new"), None, "engines.e0.accepts_new: Field required"),
        (("engines", "e1", "state"), "sleeping", "engines.e1.state: Input should be"),
        (("router", "controls_fleet"), None, "router.controls_fleet: Field required"),
        (("schema_version",), 2, "schema_version: Input should be 1"),
    ],
)
def test_a_lifecycle_document_missing_a_field_fails_loudly(
    path: tuple[str, ...], value: Any, message: str
) -> None:
    doc = example("lifecycle_initial.json")
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if value is None:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    with pytest.raises(DocumentError, match=message.replace(".", r"\.")):
        lifecycle_document(doc, R)
    with pytest.raises(ApplicationError) as err:  # in an activity: a RouterUnavailable naming the field
        parse_lifecycle(doc, R)
    assert err.value.type == "RouterUnavailable" and message in str(err.value)


def test_targets_in_our_routers_shape_use_the_configured_url() -> None:
    ours = [
        {"targets": ["127.0.0.1:9001"], "labels": {"iid": "e0", "role": "prefill", "__scheme__": "http",
         "__metrics_path__": "/vllm/metrics", "__meta_narwhal_url": "http://127.0.0.1:9001/vllm"}},
        {"targets": ["[::1]:443"], "labels": {"iid": "e1", "role": "decode", "__scheme__": "https",
         "__metrics_path__": "/v/metrics"}},
    ]  # fmt: skip
    assert target_urls(ours) == {"e0": "http://127.0.0.1:9001/vllm", "e1": "https://[::1]:443/v"}


def test_targets_with_urls_and_extra_labels() -> None:
    urls = target_urls([{"targets": ["http://h:1/"], "labels": {"engine": "e7", "job": "x"}}])
    assert urls == {"e7": "http://h:1"}
    with pytest.raises(DocumentError):
        target_urls({"targets": []})


def test_fleet_view_defaults_keep_old_histories_readable() -> None:
    # FleetView results recorded before roles_error existed still deserialise
    FleetView.model_validate({"router_url": R, "controls_fleet": True, "ready": True})
