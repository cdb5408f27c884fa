"""The lifecycle HTTP API in-process: shapes, statuses, OpenAPI, and a hypothesis fuzz of the POSTs."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from narwhal_testing.openapi import check_response, edge_bodies, is_valid_request, request_schema
from router.core import RouterCore
from router.engines.control import EngineControl
from router.journal import Journal
from router.lifecycle.document import SCHEMA_PATH
from router.lifecycle.service import LifecycleService

from .fake_engines import FakeFleet
from .helpers import fleet

SCHEMA = json.loads(SCHEMA_PATH.read_text())


class Api:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.fake = FakeFleet(3)
        self.core = RouterCore(config=fleet(contract=True), journal=Journal(None))
        self.service = LifecycleService(
            self.core, control=EngineControl(self.core.config, self.fake.transport())
        )
        self.service.machine.process_starts = {i: e.start for i, e in self.fake.engines.items()}
        app = web.Application()
        self.service.add_routes(app)

        async def make() -> TestClient[web.Request, web.Application]:
            client: TestClient[web.Request, web.Application] = TestClient(TestServer(app))
            await client.start_server()
            return client

        self.client = self.run(make())

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def call(self, method: str, path: str, data: bytes | None = None) -> tuple[int, dict[str, Any]]:
        async def go() -> tuple[int, dict[str, Any]]:
            resp = await self.client.request(method, path, data=data)
            return resp.status, await resp.json()

        return self.run(go())  # type: ignore[no-any-return]

    def state(self) -> Any:
        m = self.service.machine
        return (
            copy.deepcopy(m.records),
            m.wave_id,
            set(self.core.scheduler.draining),
            self.core.scheduler.fleet_hold,
        )


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    loop = asyncio.new_event_loop()
    a = Api(loop)
    yield a
    a.run(a.client.close())
    loop.close()


def test_drain_readmit_roundtrip(api: Api) -> None:
    status, doc = api.call("POST", "/narwhal/lifecycle/drain", b'{"engines":["e1"],"deadline_s":5}')
    assert status == 200 and doc["engines"]["e1"]["ready_to_stop"] and doc["error"] == ""
    jsonschema.validate(doc, SCHEMA)
    status, doc = api.call("POST", "/narwhal/lifecycle/readmit", b'{"engines":["e1"]}')
    assert status == 409 and doc["error"] == "readmission validation failed"
    assert doc["engines"]["e1"]["error"] == "engine process did not restart after drain"
    api.fake.engines["e1"].restart()
    status, doc = api.call("POST", "/narwhal/lifecycle/readmit", b'{"engines":["e1"]}')
    assert status == 200 and doc["engines"]["e1"]["state"] == "active", doc
    assert doc["process_starts"]["e1"] == api.fake.engines["e1"].start
    jsonschema.validate(doc, SCHEMA)


def test_not_controlling_refuses_without_engine_calls(api: Api) -> None:
    api.core.control.standby = True
    try:
        before = sum(len(e.calls) for e in api.fake.engines.values())
        for path in ("/narwhal/lifecycle/drain", "/narwhal/lifecycle/readmit"):
            status, doc = api.call("POST", path, b'{"engines":["e0"]}')
            assert status == 503 and doc["error"] == "this router does not control the fleet"
            assert doc["router"]["controls_fleet"] is False
        assert sum(len(e.calls) for e in api.fake.engines.values()) == before
        assert api.call("GET", "/narwhal/lifecycle")[0] == 200
    finally:
        api.core.control.standby = False


def test_capture_failure_is_503_and_retry_succeeds(api: Api) -> None:
    api.fake.engines["e2"].reachable = False
    status, doc = api.call("POST", "/narwhal/lifecycle/drain", b'{"engines":["e2"]}')
    assert status == 503 and doc["error"] == "e2: process identity unreadable: ConnectError"
    assert doc["engines"]["e2"]["state"] == "blocked" and not doc["engines"]["e2"]["accepts_new"]
    api.fake.engines["e2"].reachable = True
    status, doc = api.call("POST", "/narwhal/lifecycle/drain", b'{"engines":["e2"]}')
    assert status == 200 and doc["engines"]["e2"]["state"] == "drained"
    status, doc = api.call("POST", "/narwhal/lifecycle/drain", b'{"engines":["e2"]}')
    assert status == 409 and doc["error"] == "lifecycle action already active for e2"
    api.fake.engines["e2"].restart()
    assert api.call("POST", "/narwhal/lifecycle/readmit", b'{"engines":["e2"]}')[0] == 200


def test_concurrent_drain_and_readmit_serialize(api: Api) -> None:
    async def both() -> list[tuple[int, str]]:
        async def post(path: str, body: bytes) -> tuple[int, str]:
            resp = await api.client.post(path, data=body)
            return resp.status, (await resp.json())["error"]

        return list(
            await asyncio.gather(
                post("/narwhal/lifecycle/drain", b'{"engines":["e0"]}'),
                post("/narwhal/lifecycle/readmit", b'{"engines":["e0"]}'),
            )
        )

    (drain_status, _), (readmit_status, readmit_error) = api.run(both())
    assert drain_status == 200 and readmit_status == 409, readmit_error
    api.fake.engines["e0"].restart()
    assert api.call("POST", "/narwhal/lifecycle/readmit", b'{"engines":["e0"]}')[0] == 200


def test_openapi_document(api: Api) -> None:
    status, doc = api.call("GET", "/narwhal/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.1")
    drain = doc["paths"]["/narwhal/lifecycle/drain"]["post"]
    assert drain["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("DrainRequest")
    props = doc["components"]["schemas"]["DrainRequest"]["properties"]
    assert set(props) == {"engines", "wave", "deadline_s"}
    assert "#/$defs/" not in json.dumps(doc)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
engine_ids = st.lists(st.sampled_from(["e0", "e1", "e2", "zz", ""]), max_size=4)
bodies = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "engines": engine_ids | json_values,
            "wave": st.booleans() | json_values,
            "deadline_s": st.sampled_from([0.001, 1, 300, -1, 0]) | json_values,
        },
    ),
    st.dictionaries(st.sampled_from(["engines", "wave", "deadline_s", "extra"]), json_values, max_size=3),
    json_values,
)
raw_bodies = st.one_of(
    bodies.map(lambda b: json.dumps(b, allow_nan=True).encode()),
    st.sampled_from([b"", b"{", b"nul", b"[1,", b'{"engines": NaN}', b"\xff\xfe"]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["drain", "readmit"]), raw_bodies)
def test_fuzz_posts_never_5xx_and_rejections_change_nothing(api: Api, action: str, body: bytes) -> None:
    before = api.state()
    status, doc = api.call("POST", f"/narwhal/lifecycle/{action}", body)
    jsonschema.validate(doc, SCHEMA)
    assert status in (200, 409, 422, 503), (status, doc)
    if status == 503:
        assert action == "drain" and "process identity unreadable" in doc["error"]
    if status == 422 or (status == 409 and doc["error"] != "readmission validation failed"):
        assert api.state() == before, doc["error"]
        assert doc["error"]
    if status == 200:
        assert doc["error"] == ""
    _release(api)


def _release(api: Api) -> None:
    """Keep the fleet usable for the next example: release whatever this example held."""
    m = api.service.machine
    if m.held():
        for e in api.fake.engines.values():
            e.restart()
        wave = bool(m.wave_id)
        targets = m.held() if not wave else []
        for iid in targets or [None]:
            api.call(
                "POST",
                "/narwhal/lifecycle/readmit",
                json.dumps({"engines": [iid] if iid else [], "wave": wave}).encode(),
            )


# -- the OpenAPI document tells the truth about the POST bodies --------------------------------------
def _from_schema(schema: dict[str, Any], doc: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Hypothesis values valid by ``schema`` (the subset the lifecycle request schemas use)."""
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    kind = schema.get("type")
    if kind == "object":
        props = {k: _from_schema(v, doc) for k, v in schema["properties"].items()}
        return st.fixed_dictionaries({}, optional=props)
    if kind == "array":
        items = _from_schema(schema["items"], doc)
        return st.lists(items, max_size=4, unique=bool(schema.get("uniqueItems")))
    if kind == "string":
        return st.sampled_from(["e0", "e1", "e2", "", "zz"]) | st.text(max_size=6)
    if kind == "boolean":
        return st.booleans()
    if kind == "number":
        lo, hi = schema.get("minimum"), schema.get("maximum")
        return st.floats(lo, hi, allow_nan=False, allow_infinity=False) | st.integers(-(2**70), 2**70)
    raise AssertionError(f"no strategy for {schema}")


@pytest.fixture(scope="module")
def document(api: Api) -> dict[str, Any]:
    status, doc = api.call("GET", "/narwhal/openapi.json")
    assert status == 200
    return doc


def _post_valid(api: Api, doc: dict[str, Any], action: str, body: dict[str, Any]) -> None:
    path = f"/narwhal/lifecycle/{action}"
    assert is_valid_request(doc, path, body), body
    status, answer = api.call("POST", path, json.dumps(body).encode())
    assert status != 422, (body, answer["error"])  # valid by the document: never "wrong shape"
    check_response(doc, path, "post", status, answer)
    _release(api)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), action=st.sampled_from(["drain", "readmit"]))
def test_bodies_valid_by_the_openapi_document_are_never_a_422(
    api: Api, document: dict[str, Any], data: st.DataObject, action: str
) -> None:
    schema = request_schema(document, f"/narwhal/lifecycle/{action}")
    _post_valid(api, document, action, data.draw(_from_schema(schema, document)))


def test_edge_bodies_of_the_openapi_document_are_never_a_422(api: Api, document: dict[str, Any]) -> None:
    for action in ("drain", "readmit"):
        for body in edge_bodies(document, f"/narwhal/lifecycle/{action}", ["e0", "e1", "e2"]):
            _post_valid(api, document, action, body)


def test_what_the_openapi_document_refuses_is_a_422(api: Api, document: dict[str, Any]) -> None:
    path = "/narwhal/lifecycle/drain"
    for raw in (b'{"engines":["e0","e0"]}', b'{"deadline_s":1e400}', b'{"wave":1}', b'{"x":1}'):
        assert not is_valid_request(document, path, json.loads(raw)), raw
        status, answer = api.call("POST", path, raw)
        assert status == 422, (raw, answer)
        check_response(document, path, "post", status, answer)
