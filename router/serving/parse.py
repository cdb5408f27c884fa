"""Request parsing and validation for the completion routes (spec §11.1). Pure, hand-written checks.

Pydantic is deliberately kept off this hot path: a handful of ``type()`` checks on an orjson dict
costs microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

from router.serving.errors import ClientError
from router.serving.params import refusal

Endpoint = Literal["completions", "chat"]
PATHS: dict[Endpoint, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# Reserved for the router's own use in the vLLM dialect: a client may not set them.
_RESERVED_XARGS = ("kv_transfer_params", "ec_transfer_params", "kv_cache_report_mode")
_INT_FIELDS = ("n", "best_of", "max_tokens", "max_completion_tokens", "min_tokens")


@dataclass(slots=True)
class ParsedRequest:
    endpoint: Endpoint
    body: dict[str, Any]
    stream: bool
    want_token_ids: bool
    include_usage: bool
    raw: bytes = b""  # the client's body as sent (the decode leg's body is spliced from it)
    model_given: bool = True  # the client named the model (else the router adds it to the legs)


def _bad(message: str, param: str | None = None, code: str | None = None) -> ClientError:
    return ClientError(400, message, "invalid_request_error", code, param)


def _is_int(v: Any) -> bool:
    return type(v) is int


def _check_min_tokens(body: dict[str, Any], endpoint: Endpoint, max_tokens_limit: int | None) -> None:
    """``min_tokens`` (vLLM's sampling parameter): at least 0, within the model's context like
    ``max_tokens``, and at most the request's own ``max_tokens`` (vLLM's rule and message; for chat
    ``max_completion_tokens`` when given, as vLLM reads it)."""
    v = body.get("min_tokens")
    if v is None:
        return
    if v < 0:
        raise _bad(f"min_tokens must be greater than or equal to 0, got {v}.", "min_tokens")
    if max_tokens_limit is not None and v > max_tokens_limit:
        raise _bad(
            f"'min_tokens' ({v}) exceeds the model's context of {max_tokens_limit} tokens",
            "min_tokens",
            "context_length_exceeded",
        )
    cap = body.get("max_completion_tokens") if endpoint == "chat" else None
    if cap is None:
        cap = body.get("max_tokens")
    if cap is not None and v > cap:
        raise _bad(f"min_tokens must be less than or equal to max_tokens={cap}, got {v}.", "min_tokens")


def parse_request(
    raw: bytes, endpoint: Endpoint, model: str, max_tokens_limit: int | None = None
) -> ParsedRequest:
    """Validate a request body; raises :class:`ClientError` (400/404) with the spec error shape.

    ``max_tokens_limit``: the model's context (``serving.max_tokens_limit``, or the smallest
    ``max_model_len`` the engines report); a larger ``max_tokens`` is refused before any engine.
    """
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _bad(f"request body is not valid JSON: {exc.msg}") from None
    if type(body) is not dict:
        raise _bad("request body must be a JSON object")

    m = body.get("model")
    model_given = m is not None
    if m is None:
        body["model"] = model
    elif type(m) is not str:
        raise _bad("'model' must be a string", "model")
    elif m != model:
        raise ClientError(
            404, f"The model `{m}` does not exist.", "invalid_request_error", "model_not_found", "model"
        )

    stream = body.get("stream", False)
    if stream is None:
        stream = False
    elif type(stream) is not bool:
        raise _bad("'stream' must be a boolean", "stream")

    if body.get("stream_options") is not None and not stream:  # as vLLM: 400, not a 502 from the decode leg
        raise _bad("'stream_options' can only be set when 'stream' is true", "stream_options")

    for key in _INT_FIELDS:
        v = body.get(key)
        if v is not None and not _is_int(v):
            raise _bad(f"'{key}' must be an integer", key)
    for key in ("n", "best_of"):
        v = body.get(key)
        if v is not None and v < 1:
            raise _bad(f"'{key}' must be at least 1", key)
    refused = refusal(body)  # serving/params.py: the parameter table (docs/api.md)
    if refused is not None:
        raise _bad(refused[1], refused[0])
    for key in ("max_tokens", "max_completion_tokens"):
        v = body.get(key)
        if v is not None and v < 1:
            raise _bad(f"'{key}' must be at least 1", key)
        if v is not None and max_tokens_limit is not None and v > max_tokens_limit:
            raise _bad(
                f"'{key}' ({v}) exceeds the model's context of {max_tokens_limit} tokens",
                key,
                "context_length_exceeded",
            )
    _check_min_tokens(body, endpoint, max_tokens_limit)

    if endpoint == "completions":
        prompt = body.get("prompt")
        if prompt is None:
            raise _bad("'prompt' is required", "prompt")
        if type(prompt) is not str and type(prompt) is not list:
            raise _bad("'prompt' must be a string or an array", "prompt")
        if type(prompt) is list and not prompt:
            raise _bad("'prompt' must not be empty", "prompt")
    else:
        messages = body.get("messages")
        if type(messages) is not list or not messages:
            raise _bad("'messages' must be a non-empty array of objects", "messages")
        for msg in messages:
            if type(msg) is not dict:
                raise _bad("'messages' must be a non-empty array of objects", "messages")

    if "kv_transfer_params" in body:
        raise _bad("'kv_transfer_params' is reserved for the router", "kv_transfer_params")
    xargs = body.get("vllm_xargs")
    if xargs is not None:
        if type(xargs) is not dict:
            raise _bad("'vllm_xargs' must be an object", "vllm_xargs")
        for key in _RESERVED_XARGS:
            if key in xargs:
                raise _bad(f"'vllm_xargs.{key}' is reserved for the router", f"vllm_xargs.{key}")

    want_ids = body.get("return_token_ids") is True
    opts = body.get("stream_options")
    include_usage = type(opts) is dict and opts.get("include_usage") is True
    return ParsedRequest(endpoint, body, stream, want_ids, include_usage, raw, model_given)
