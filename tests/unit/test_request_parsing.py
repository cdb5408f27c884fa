"""Request parsing/validation for the completion routes (spec §11.1) and the engine leg bodies."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from router.engines.legs import decode_body, decode_request, find_descriptor, prefill_body
from router.serving.errors import ClientError
from router.serving.handler import buffered_head_bound, engine_request_id
from router.serving.parse import parse_request

MODEL = "m"


def parse(body: Any, endpoint: str = "completions") -> Any:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return parse_request(raw, endpoint, MODEL)  # type: ignore[arg-type]


def err(body: Any, endpoint: str = "completions") -> ClientError:
    with pytest.raises(ClientError) as info:
        parse(body, endpoint)
    return info.value


def test_valid_completion_and_chat() -> None:
    p = parse({"model": MODEL, "prompt": "hi", "max_tokens": 3, "stream": True, "return_token_ids": True})
    assert (p.stream, p.want_token_ids, p.include_usage) == (True, True, False)
    c = parse(
        {
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        "chat",
    )
    assert c.body["model"] == MODEL and c.stream is True and c.include_usage is True


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": 3, "prompt": "x"}, "model"),
        ({"prompt": "x", "stream": "yes"}, "stream"),
        ({"prompt": "x", "n": "2"}, "n"),
        ({"prompt": "x", "max_tokens": 1.5}, "max_tokens"),
        ({"prompt": "x", "max_tokens": True}, "max_tokens"),
        ({"prompt": "x", "max_completion_tokens": "4"}, "max_completion_tokens"),
        ({"prompt": "x", "best_of": None, "n": 0}, "n"),
        ({"prompt": "x", "best_of": 3}, "best_of"),
        ({"prompt": "x", "prompt_logprobs": 0}, "prompt_logprobs"),
        ({"prompt": "x", "prompt_logprobs": 5}, "prompt_logprobs"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"prompt": "x", "stream": False, "stream_options": {}}, "stream_options"),
        ({"prompt": 7}, "prompt"),
        ({}, "prompt"),
        ({"prompt": "x", "kv_transfer_params": {"do_remote_decode": True}}, "kv_transfer_params"),
        ({"prompt": "x", "vllm_xargs": {"kv_transfer_params": {}}}, "vllm_xargs.kv_transfer_params"),
        ({"prompt": "x", "vllm_xargs": {"ec_transfer_params": {}}}, "vllm_xargs.ec_transfer_params"),
        ({"prompt": "x", "vllm_xargs": {"kv_cache_report_mode": 1}}, "vllm_xargs.kv_cache_report_mode"),
    ],
)
def test_rejected_with_400_and_param(body: dict[str, Any], param: str) -> None:
    e = err(body)
    assert (e.status, e.type, e.param) == (400, "invalid_request_error", param)


@pytest.mark.parametrize("messages", [None, [], "hi", [1], [{"role": "user"}, "x"]])
def test_chat_messages_must_be_array_of_objects(messages: Any) -> None:
    body: dict[str, Any] = {} if messages is None else {"messages": messages}
    assert err(body, "chat").param == "messages"


@pytest.mark.parametrize("raw", [b"", b"{", b"[1,2]", b'"x"', b"null", b"\xff\xfe"])
def test_body_must_be_a_json_object(raw: bytes) -> None:
    e = err(raw)
    assert e.status == 400 and e.type == "invalid_request_error"


def test_unknown_model_is_404_model_not_found() -> None:
    e = err({"model": "other", "prompt": "x"})
    assert (e.status, e.code, e.param) == (404, "model_not_found", "model")


def test_n_equal_one_is_fine() -> None:
    assert parse({"prompt": ["a", "b"], "n": 1, "best_of": 1}).body["n"] == 1


def test_n_above_one_is_served_like_vllm() -> None:
    """n > 1 goes to the decode leg (the prefill leg runs one sequence); best_of > 1 is refused."""
    p = parse({"prompt": "a", "n": 3, "best_of": None})
    assert p.body["n"] == 3
    assert "n" not in orjson.loads(prefill_body(p.body, MODEL))


def _spliced(raw: bytes, stream: bool, desc: dict[str, Any] | None) -> bytes:
    p = parse_request(raw, "completions", MODEL)
    assert p.stream is stream
    return decode_request(p.raw, p.body, MODEL, desc, p.model_given)


def test_decode_leg_gets_the_clients_bytes_with_only_the_pd_fields_spliced_in() -> None:
    desc = {"remote_engine_id": "e0-1", "remote_block_ids": [1, 2]}
    raw = b'{"model":"m","prompt":"x","temperature":0.70,"top_p":1e-1,"x_unknown":{"a":[1.50]} }\n'
    out = _spliced(raw, False, desc)  # buffered: only the descriptor is added
    assert out == raw[: raw.rindex(b"}")].rstrip() + b',"kv_transfer_params":' + orjson.dumps(desc) + b"}\n"
    raw = b'{"prompt":"x","stream":true}'
    out = _spliced(raw, True, None)  # streamed, no model given, decode on the producer itself
    assert out == b'{"prompt":"x","stream":true,"model":"m","return_token_ids":true,"stream_interval":1}'
    raw = b'{"prompt":"x","stream":true,"return_token_ids":true,"model":"m"}'
    assert _spliced(raw, True, None) == raw[:-1] + b',"stream_interval":1}'


def test_a_field_the_split_sets_differently_rebuilds_the_body_with_the_same_values() -> None:
    raw = b'{"prompt":"x","stream":true,"return_token_ids":false,"temperature":0.7}'
    body = orjson.loads(_spliced(raw, True, None))
    assert body["return_token_ids"] is True and body["temperature"] == 0.7  # no duplicate keys


def test_prefill_body_shape() -> None:
    client = {
        "model": MODEL,
        "prompt": "x",
        "stream": True,
        "stream_options": {"include_usage": True},
        "min_tokens": 2,
        "n": 1,
        "best_of": 1,
        "max_completion_tokens": 9,
        "temperature": 0.5,
    }
    body = orjson.loads(prefill_body(client, MODEL))
    assert body == {
        "model": MODEL,
        "prompt": "x",
        "stream": False,
        "temperature": 0.5,
        "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True},
    }


def test_decode_body_shape() -> None:
    desc = {"remote_engine_id": "e0-1", "remote_block_ids": [1, 2]}
    body = orjson.loads(decode_body({"prompt": "x", "stream": False, "max_tokens": 4}, MODEL, desc))
    assert body == {
        "prompt": "x",
        "stream": True,
        "max_tokens": 4,
        "model": MODEL,
        "return_token_ids": True,
        "stream_interval": 1,
        "kv_transfer_params": desc,
    }
    assert "kv_transfer_params" not in orjson.loads(decode_body({"prompt": "x"}, MODEL, None))


@pytest.mark.parametrize(
    ("doc", "ok"),
    [
        ({"kv_transfer_params": {"remote_engine_id": "a", "remote_block_ids": [1, 2]}}, True),
        (
            {
                "choices": [
                    {"kv_transfer_params": {"remote_engine_id": "a", "remote_block_ids": [[1], [2, 3]]}}
                ]
            },
            True,
        ),
        ({"choices": [{"kv_transfer_params": None}]}, False),
        ({"kv_transfer_params": {"remote_engine_id": 1, "remote_block_ids": [1]}}, False),
        ({"kv_transfer_params": {"remote_engine_id": "a", "remote_block_ids": [-1]}}, False),
        ({"kv_transfer_params": {"remote_engine_id": "a", "remote_block_ids": "1,2"}}, False),
        ({"kv_transfer_params": {"remote_engine_id": "a"}}, False),
        ([], False),
    ],
)
def test_descriptor(doc: Any, ok: bool) -> None:
    assert (find_descriptor(doc) is not None) is ok


@pytest.mark.parametrize(("key", "value"), [("n", 0), ("n", -3), ("best_of", 0)])
def test_n_below_one_is_a_400(key: str, value: int) -> None:
    e = err({"prompt": "x", key: value})
    assert (e.status, e.param) == (400, key) and "at least 1" in e.message


@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_above_the_context_is_a_400(key: str) -> None:
    with pytest.raises(ClientError) as info:
        parse_request(orjson.dumps({"prompt": "x", key: 2**63 - 1}), "completions", MODEL, 8192)
    e = info.value
    assert (e.status, e.code, e.param) == (400, "context_length_exceeded", key)
    assert (
        parse_request(orjson.dumps({"prompt": "x", key: 8192}), "completions", MODEL, 8192).body[key] == 8192
    )
    assert parse_request(orjson.dumps({"prompt": "x", key: 2**40}), "completions", MODEL).body[key] == 2**40


def test_min_tokens_is_bounded_like_max_tokens() -> None:
    def refused(body: dict[str, Any], endpoint: str = "completions", limit: int | None = 8192) -> ClientError:
        with pytest.raises(ClientError) as info:
            parse_request(orjson.dumps(body), endpoint, MODEL, limit)  # type: ignore[arg-type]
        assert (info.value.status, info.value.param) == (400, "min_tokens")
        return info.value

    e = refused({"prompt": "x", "min_tokens": 2**63 - 1})
    assert e.code == "context_length_exceeded" and "context of 8192 tokens" in e.message
    assert "must be an integer" in refused({"prompt": "x", "min_tokens": 1.5}).message
    assert "must be an integer" in refused({"prompt": "x", "min_tokens": True}).message
    assert refused({"prompt": "x", "min_tokens": -1}).message == (
        "min_tokens must be greater than or equal to 0, got -1."
    )
    # vLLM's rule and message: min_tokens above the request's own max_tokens
    for limit in (8192, None):
        e = refused({"prompt": "x", "max_tokens": 4, "min_tokens": 5}, limit=limit)
        assert e.message == "min_tokens must be less than or equal to max_tokens=4, got 5."
    chat = {"messages": [{"role": "user", "content": "x"}]}
    e = refused({**chat, "max_tokens": 100, "max_completion_tokens": 4, "min_tokens": 5}, "chat")
    assert "max_tokens=4" in e.message  # chat: max_completion_tokens is the bound when given
    for ok, endpoint in (
        ({"prompt": "x", "min_tokens": 0}, "completions"),
        ({"prompt": "x", "min_tokens": 8192}, "completions"),
        ({"prompt": "x", "max_tokens": 4, "min_tokens": 4}, "completions"),
        ({**chat, "max_completion_tokens": 9, "max_tokens": 2, "min_tokens": 9}, "chat"),
    ):
        body = parse_request(orjson.dumps(ok), endpoint, MODEL, 8192).body  # type: ignore[arg-type]
        assert body["min_tokens"] == ok["min_tokens"]


@pytest.mark.parametrize(
    ("ids", "ok"),
    [
        (list(range(300)), True),
        ([*range(300), -1], False),
        ([*range(300), True], False),  # a bool is not a block id
        ([*range(300), 1.0], False),
        ([*range(300), [301, 302]], True),  # grouped and flat items mixed
        ([*range(300), [301, -2]], False),
        ([], True),
    ],
)
def test_descriptor_block_ids(ids: list[Any], ok: bool) -> None:
    doc = {"kv_transfer_params": {"remote_engine_id": "a", "remote_block_ids": ids}}
    assert (find_descriptor(doc) is not None) is ok


@pytest.mark.parametrize(
    ("body", "bound"),
    [
        ({"max_tokens": 1}, 2.5),
        ({"max_tokens": 5}, 2.5 + 4 * 10.0),
        ({"max_completion_tokens": 3, "max_tokens": 50}, 2.5 + 2 * 10.0),
        ({}, 0.0),  # unbounded request: only serving.request_timeout_s
    ],
)
def test_a_buffered_decode_leg_may_take_what_a_streamed_one_could(body: dict[str, Any], bound: float) -> None:
    """First token within first_token_timeout_s, every next step within decode_read_timeout_s."""
    assert buffered_head_bound(body, 2.5, 10.0) == bound


@pytest.mark.parametrize(
    ("client", "sent"),
    [
        ("req-42", "req-42"),
        ("a" * 128, "a" * 128),
        (None, "r" * 32),
        ("", "r" * 32),
        ("a" * 129, "r" * 32),  # too long for a header we forward
        ("two words", "r" * 32),
        ("caf\u00e9", "r" * 32),  # not ASCII
        ("tab\there", "r" * 32),
    ],
)
def test_the_engine_legs_carry_the_clients_request_id_when_usable(client: str | None, sent: str) -> None:
    assert engine_request_id(client, "r" * 32) == sent
