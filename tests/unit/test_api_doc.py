"""docs/api.md's parameter table is the code's (router/serving/params.py), and the code acts on it."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from router.engines.legs import prefill_body
from router.serving.errors import ClientError
from router.serving.params import PARAMETERS, Parameter, markdown_table
from router.serving.parse import parse_request

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
ISSUE_PARAMETERS = {
    "n",
    "best_of",
    "echo",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "stop",
    "stop_token_ids",
    "seed",
    "response_format",
    "tools",
    "tool_choice",
    "stream_options.include_usage",
    "stream_options.continuous_usage_stats",
}


def test_the_doc_holds_the_codes_table() -> None:
    assert markdown_table() in DOC.read_text()


def test_every_parameter_the_router_must_account_for_is_in_the_table() -> None:
    assert ISSUE_PARAMETERS <= {p.name for p in PARAMETERS}


def _value(name: str) -> object:
    return {"tools": [{"type": "function", "function": {"name": "f"}}], "stop": ["x"]}.get(name, 2)


@pytest.mark.parametrize("param", PARAMETERS, ids=[p.name for p in PARAMETERS])
def test_each_row_is_what_the_router_does(param: Parameter) -> None:
    top, _, sub = param.name.partition(".")
    value: object = {sub: True} if sub else _value(top)
    if top == "stream":
        value = True
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], top: value}
    if top == "stream_options":
        body["stream"] = True
    raw = orjson.dumps(body)
    if param.route == "refused":
        with pytest.raises(ClientError) as info:
            parse_request(raw, "chat", "m")
        assert (info.value.status, info.value.param) == (400, param.name)
        return
    parsed = parse_request(raw, "chat", "m")
    assert parsed.body[top] == value  # never dropped on the way in
    prefill = orjson.loads(prefill_body(parsed.body, "m"))
    if param.route == "both legs":
        assert prefill[top] == value
    elif top in ("max_tokens", "stream"):
        assert prefill[top] == (1 if top == "max_tokens" else False)  # the split sets these
    else:
        assert top not in prefill
