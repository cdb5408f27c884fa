"""Differential: the same requests sent to a simulated decode engine directly and through a real
router process (PD split: prefill on e0, decode on e1/e2) give the same answer, buffered and
streamed; the decode engine sees every field the client sent, as the client wrote it; the
``openai`` SDK parses every answer. One router and three engines for the whole module."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.integration.serving_support import contract_free_fleet, settled_rows
from tests.support import loopback
from tests.support.fleet import SimEngine, reset_faults, set_fault, sim_requests, start_sims
from tests.support.procs import proc_group
from tests.support.router import RouterHandle, start_router

pytestmark = pytest.mark.integration
MODEL = "sim-model"
PATH = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "look a word up",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
]
_MSGS = [{"role": "user", "content": "tell me about narwhals"}]

# (name, endpoint, client body without "stream", what the direct answer must show)
SHAPES: list[tuple[str, str, dict[str, Any], str]] = [
    ("plain", "completions", {"prompt": "the narwhal", "max_tokens": 6}, "text"),
    ("logprobs", "completions", {"prompt": "a tusk", "max_tokens": 5, "logprobs": 2}, "logprobs"),
    ("stop", "completions", {"prompt": "cold water", "max_tokens": 12, "stop": ["e"]}, "stop"),
    ("echo", "completions", {"prompt": "arctic sea", "max_tokens": 4, "echo": True}, "echo"),
    (
        "seed",
        "completions",
        {"prompt": "ice", "max_tokens": 5, "seed": 7, "temperature": 0.7, "top_p": 0.95},
        "text",
    ),
    ("n2", "completions", {"prompt": "pods of", "max_tokens": 4, "n": 2}, "n2"),
    ("chat", "chat", {"messages": _MSGS, "max_tokens": 5}, "content"),
    (
        "tool_call",
        "chat",
        {"messages": _MSGS, "max_tokens": 5, "tools": _TOOLS, "tool_choice": "auto"},
        "tools",
    ),
    (
        "json",
        "chat",
        {"messages": _MSGS, "max_tokens": 5, "response_format": {"type": "json_object"}},
        "json",
    ),
    (
        "chat_logprobs",
        "chat",
        {"messages": _MSGS, "max_tokens": 4, "logprobs": True, "top_logprobs": 2},
        "chat_logprobs",
    ),
    ("chat_n2_stop", "chat", {"messages": _MSGS, "max_tokens": 10, "n": 2, "stop": ["a"]}, "n2"),
    (
        "usage",
        "chat",
        {
            "messages": _MSGS,
            "max_tokens": 4,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
        "usage",
    ),
]
_ids = itertools.count()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RouterHandle, list[SimEngine]]]:
    tmp = tmp_path_factory.mktemp("fidelity")
    with proc_group(tmp) as group:
        sims = start_sims(group, 3, roles=["prefill", "decode", "decode"])
        path = contract_free_fleet(tmp, sims, request_timeout_s=120.0)
        router = start_router(group, path, tmp, wait_ready=True)
        yield router, sims


def _body(shape: dict[str, Any], stream: bool) -> bytes:
    body = {"model": MODEL, **shape, "narwhal_unknown_field": {"kept": [1, 2.50]}}
    if stream:
        body["stream"] = True
    else:
        body.pop("stream_options", None)  # (vLLM refuses stream_options on a buffered request)
    # written by hand so the test can check the decode engine got these very bytes
    return orjson.dumps(body).replace(b'"kept":[1,2.5]', b'"kept":[1,2.50]')


def _post(base: str, endpoint: str, raw: bytes, rid: str) -> httpx.Response:
    headers = {"content-type": "application/json", "x-request-id": rid}
    r = loopback.post(base + PATH[endpoint], content=raw, headers=headers, timeout=30.0)
    assert r.status_code == 200, r.text
    return r


def _events(r: httpx.Response) -> list[dict[str, Any]]:
    frames = [f for f in r.text.split("\n\n") if f.strip()]
    assert frames[-1] == "data: [DONE]", frames[-1:]
    out = []
    for f in frames[:-1]:
        assert f.startswith("data: "), f
        out.append(orjson.loads(f[6:]))
    return out


def _without_created(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "created"}


def _sdk_parse(endpoint: str, routed: httpx.Response, stream: bool) -> list[Any]:
    """The routed answer's bytes through the ``openai`` SDK's own response parsing (the SDK's
    client over a transport that replays them)."""
    content, ctype = routed.content, routed.headers["content-type"]

    def replay(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=content, headers={"content-type": ctype})

    http = httpx.Client(transport=httpx.MockTransport(replay))
    client = openai.OpenAI(base_url="http://replay/v1", api_key="unused", max_retries=0, http_client=http)
    with http:
        if endpoint == "completions":
            out: Any = client.completions.create(model=MODEL, prompt="x", stream=stream)
        else:
            out = client.chat.completions.create(model=MODEL, messages=_MSGS, stream=stream)  # type: ignore[arg-type]
        parsed = list(out) if stream else [out]
    for obj in parsed:
        assert isinstance(obj, (ChatCompletionChunk if stream else ChatCompletion, Completion)), obj
        assert obj.id.startswith(("cmpl-routed-", "chatcmpl-routed-"))
    return parsed


def _check_feature(feature: str, docs: list[dict[str, Any]], stream: bool) -> None:
    """The direct answer really exercises the shape (else an equal answer would prove nothing)."""
    choices = [c for d in docs for c in d["choices"]]
    key = "delta" if "delta" in (choices[0] if choices else {}) else "message"
    if feature == "logprobs":
        assert all(c["logprobs"]["tokens"] for c in choices if c["text"])
    elif feature == "chat_logprobs":
        assert any(c["logprobs"] and c["logprobs"]["content"] for c in choices)
    elif feature == "stop":
        assert any(c["finish_reason"] == "stop" and c["stop_reason"] == "e" for c in choices)
    elif feature == "echo":
        assert choices[0]["text"].startswith("arctic sea")
    elif feature == "n2":
        assert {c["index"] for c in choices} == {0, 1}
    elif feature == "tools":
        calls = [t for c in choices for t in (c[key].get("tool_calls") or [])]
        assert calls and any(c["finish_reason"] == "tool_calls" for c in choices)
    elif feature == "json":
        text = "".join(c[key].get("content") or "" for c in choices)
        assert orjson.loads(text)["answer"]
    elif feature == "usage" and not stream:
        assert docs[0]["usage"]["completion_tokens"] == 4
    elif feature == "usage":
        assert docs[-1]["choices"] == [] and docs[-1]["usage"]["completion_tokens"] == 4
        assert all(d.get("usage") for d in docs[1:])  # continuous usage: on every token chunk
    else:
        assert any(c.get("text") or (c.get(key) or {}).get("content") for c in choices)


def _decode_leg(sims: list[SimEngine], rid: str) -> tuple[str, bytes]:
    rows = [(s.iid, r) for s in sims[1:] for r in sim_requests(s.url) if r["x_request_id"] == rid]
    assert len(rows) == 1, rows
    return rows[0][0], rows[0][1]["body"].encode()


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
@pytest.mark.parametrize(("name", "endpoint", "shape", "feature"), SHAPES, ids=[s[0] for s in SHAPES])
def test_routed_answer_equals_the_decode_engines_own(
    fleet: tuple[RouterHandle, list[SimEngine]],
    name: str,
    endpoint: str,
    shape: dict[str, Any],
    feature: str,
    stream: bool,
) -> None:
    router, sims = fleet
    raw = _body(shape, stream)
    n = next(_ids)
    direct_rid, routed_rid = f"direct-{name}-{n}", f"routed-{name}-{n}"
    direct = _post(sims[1].url, endpoint, raw, direct_rid)
    routed = _post(router.url, endpoint, raw, routed_rid)
    if stream:
        want, got = _events(direct), _events(routed)
    else:
        want, got = [direct.json()], [routed.json()]
    _check_feature(feature, want, stream)
    # The same documents (the engine names its answer after the request id it was sent: the
    # client's own, forwarded to the legs), but for their creation times.
    strip = {direct_rid: routed_rid}
    want_docs = [{**_without_created(d), "id": d["id"].replace(direct_rid, strip[direct_rid])} for d in want]
    assert [_without_created(d) for d in got] == want_docs
    assert len(_sdk_parse(endpoint, routed, stream)) == len(got)
    # The decode engine got the client's body byte for byte, with only the PD split's fields
    # spliced in before the closing brace.
    _iid, leg = _decode_leg(sims, routed_rid)
    assert leg.startswith(raw[:-1]), (leg[:200], raw[:200])
    added = orjson.loads(leg)
    client = orjson.loads(raw)
    assert {k: added[k] for k in client} == client
    extra = set(added) - set(client)
    assert extra <= {"kv_transfer_params", "return_token_ids", "stream_interval"}
    assert "kv_transfer_params" in extra
    assert b'"temperature":0.7' in leg or "temperature" not in client
    # The prefill leg got the same request id and every client field it needs, unchanged.
    prefill = [r for r in sim_requests(sims[0].url) if r["x_request_id"] == routed_rid]
    assert len(prefill) == 1
    pbody = orjson.loads(prefill[0]["body"])
    keep = {k: v for k, v in client.items() if k not in ("stream", "stream_options", "n", "max_tokens")}
    assert {k: pbody[k] for k in keep} == keep
    assert (pbody["max_tokens"], pbody["stream"]) == (1, False)


def test_sdk_client_streams_a_tool_call_and_the_journal_names_the_request_id(
    fleet: tuple[RouterHandle, list[SimEngine]],
) -> None:
    router, sims = fleet
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=_MSGS,  # type: ignore[arg-type]
        max_tokens=4,
        tools=_TOOLS,  # type: ignore[arg-type]
        stream=True,
        extra_headers={"x-request-id": "sdk-tool-1"},
    )
    chunks = list(stream)
    args = "".join(
        t.function.arguments or ""
        for c in chunks
        for ch in c.choices
        for t in ch.delta.tool_calls or []
        if t.function is not None
    )
    assert orjson.loads(args)["query"]
    assert {c.id for c in chunks} == {"chatcmpl-sdk-tool-1"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    done = client.chat.completions.create(
        model=MODEL,
        messages=_MSGS,  # type: ignore[arg-type]
        max_tokens=4,
        tools=_TOOLS,  # type: ignore[arg-type]
        extra_headers={"x-request-id": "sdk-tool-2"},
    )
    call = done.choices[0].message.tool_calls
    assert call and call[0].function.name == "lookup" and done.choices[0].finish_reason == "tool_calls"
    rows = {r.get("client_rid"): r for r in settled_rows(router)}
    assert rows["sdk-tool-1"]["engine_rid"] == "sdk-tool-1" and rows["sdk-tool-1"]["terminal"] == "completed"
    assert rows["sdk-tool-2"]["ttft_s"] is not None
    # without a client id, both legs carry the router's own (the response's x-request-id)
    r = loopback.post(
        router.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2}, timeout=30.0
    )
    rid = r.headers["x-request-id"]
    assert r.json()["id"] == f"cmpl-{rid}"
    assert any(q["x_request_id"] == rid for q in sim_requests(sims[0].url))


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "best_of": 2}, "best_of"),
        ({"prompt": "x", "prompt_logprobs": 1}, "prompt_logprobs"),
    ],
)
def test_unsupported_parameters_are_refused_by_name(
    fleet: tuple[RouterHandle, list[SimEngine]], body: dict[str, Any], param: str
) -> None:
    router, _ = fleet
    r = loopback.post(router.url + "/v1/completions", json={"model": MODEL, **body}, timeout=30.0)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_a_buffered_answer_that_stalls_mid_body_is_cut_after_decode_read_timeout(
    fleet: tuple[RouterHandle, list[SimEngine]],
) -> None:
    """request_timeout_s is 120 s here and the client waits at most 30 s: only the 1 s
    decode_read_timeout_s between body bytes can end a stalled leg. Both decode engines stall, so
    both attempts are cut and the client gets a 504 naming the stall; the journal names both."""
    router, sims = fleet
    for s in sims[1:]:
        set_fault(s.url, stall_body=True)
    try:
        r = loopback.post(
            router.url + "/v1/completions",
            json={"model": MODEL, "prompt": "stall", "max_tokens": 3},
            headers={"x-request-id": "stall-1"},
            timeout=30.0,
        )
    finally:
        for s in sims[1:]:
            reset_faults(s.url)
    assert r.status_code == 504, r.text
    assert "stalled" in r.json()["error"]["message"]
    row = next(x for x in settled_rows(router) if x.get("client_rid") == "stall-1")
    assert row["attempts"] == 2 and all(f.endswith(":stream") for f in row["attempt_failures"])
