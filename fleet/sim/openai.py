"""OpenAI/vLLM request parsing and response shapes (completions and chat completions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

from fleet.sim.state import approx_tokens

Kind = Literal["prefill", "decode", "plain"]
DEFAULT_MAX_TOKENS = 16


class RequestError(Exception):
    def __init__(self, status: int, message: str, type_: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param


def error_body(status: int, message: str, type_: str, param: str | None = None) -> dict[str, Any]:
    """vLLM's ``ErrorResponse`` shape."""
    return {"error": {"message": message, "type": type_, "param": param, "code": status}}


@dataclass(frozen=True)
class Parsed:
    chat: bool
    kind: Kind
    model: str | None
    key: bytes
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    return_token_ids: bool
    kv_params: dict[str, Any] | None


def _int(body: dict[str, Any], name: str) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise RequestError(400, f"{name} must be an integer", param=name)
    return v


def _prompt(body: dict[str, Any]) -> tuple[bytes, int]:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt.encode(), approx_tokens(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            text = "\n".join(prompt)
            return text.encode(), approx_tokens(text)
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return orjson.dumps(prompt), len(prompt)
        if all(isinstance(p, list) for p in prompt):
            return orjson.dumps(prompt), sum(len(p) for p in prompt)
    raise RequestError(400, "prompt must be a string, a list of strings or token ids", param="prompt")


def _messages(body: dict[str, Any]) -> tuple[bytes, int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages must be a non-empty list", param="messages")
    parts: list[str] = []
    for m in messages:
        if not isinstance(m, dict):
            raise RequestError(400, "each message must be an object", param="messages")
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
        parts.append(f"{m.get('role', 'user')}: {content or ''}")
    text = "\n".join(parts)
    return text.encode(), approx_tokens(text)


def parse(body: Any, chat: bool) -> Parsed:
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(400, "model must be a string", param="model")
    key, prompt_tokens = _messages(body) if chat else _prompt(body)
    max_tokens = _int(body, "max_tokens")
    if chat and max_tokens is None:
        max_tokens = _int(body, "max_completion_tokens")
    _int(body, "min_tokens")
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if max_tokens < 1:
        raise RequestError(400, "max_tokens must be at least 1", param="max_tokens")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(400, "stream must be a boolean", param="stream")
    opts = body.get("stream_options")
    if opts is not None and not stream:  # vLLM's validator
        raise RequestError(
            400, "Stream options can only be defined when `stream=True`.", param="stream_options"
        )
    include_usage = isinstance(opts, dict) and opts.get("include_usage") is True
    kv = body.get("kv_transfer_params")
    if kv is not None and not isinstance(kv, dict):
        raise RequestError(400, "kv_transfer_params must be an object", param="kv_transfer_params")
    kind: Kind = "plain"
    if kv and kv.get("do_remote_prefill"):
        kind = "decode"
    elif kv and kv.get("do_remote_decode"):
        kind = "prefill"
    return Parsed(
        chat=chat,
        kind=kind,
        model=model,
        key=key,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=include_usage,
        return_token_ids=body.get("return_token_ids") is True,
        kv_params=kv,
    )


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


@dataclass(frozen=True)
class Meta:
    rid: str
    created: int
    model: str
    chat: bool

    def head(self, chunk: bool) -> dict[str, Any]:
        if self.chat:
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model}


def full_body(
    meta: Meta,
    text: str,
    token_ids: list[int],
    prompt_ids: list[int] | None,
    prompt_tokens: int,
    kv: dict[str, Any] | None,
    empty: bool = False,
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "length", "stop_reason": None}
    if meta.chat:
        choice["message"] = {
            "role": "assistant",
            "content": text,
            "tool_calls": [],
            "reasoning_content": None,
        }
    else:
        choice["text"] = text
        choice["prompt_logprobs"] = None
    if prompt_ids is not None:
        choice["token_ids"] = token_ids
        if not meta.chat:
            choice["prompt_token_ids"] = prompt_ids
    body = meta.head(chunk=False)
    body["choices"] = [] if empty else [choice]
    body["usage"] = usage(prompt_tokens, 0 if empty else len(token_ids))
    if meta.chat and prompt_ids is not None:
        body["prompt_token_ids"] = prompt_ids
    body["kv_transfer_params"] = kv
    return body


def chunk(
    meta: Meta,
    text: str | None,
    token_ids: list[int] | None,
    finish: str | None,
    role: bool = False,
    prompt_ids: list[int] | None = None,
) -> bytes:
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
    if meta.chat:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
        if text is not None:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
        choice["stop_reason"] = None
    if token_ids is not None:
        choice["token_ids"] = token_ids
        if prompt_ids is not None and not meta.chat:
            choice["prompt_token_ids"] = prompt_ids
    body = meta.head(chunk=True)
    body["choices"] = [choice]
    if prompt_ids is not None and meta.chat:
        body["prompt_token_ids"] = prompt_ids
    return sse(body)


def usage_chunk(meta: Meta, prompt_tokens: int, completion_tokens: int) -> bytes:
    body = meta.head(chunk=True)
    body["choices"] = []
    body["usage"] = usage(prompt_tokens, completion_tokens)
    return sse(body)


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


DONE = b"data: [DONE]\n\n"
