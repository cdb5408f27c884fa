"""Decode-stream chunks: count tokens and strip the fields the router added (token ids). Pure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson


class StreamError(Exception):
    """A decode chunk the router cannot use (not JSON, or an engine error event)."""


class StreamState:
    """What the router learned from one decode stream so far."""

    __slots__ = ("prompt_tokens", "tokens", "usage")

    def __init__(self) -> None:
        self.tokens = 0
        self.usage: dict[str, Any] | None = None
        self.prompt_tokens: int | None = None


# A choice delta of any of these kinds is output (the first one is the first token): a tool-call
# stream has no ``content``, a reasoning model starts with ``reasoning_content``.
_DELTA_OUTPUT = ("content", "tool_calls", "reasoning_content", "reasoning", "refusal", "function_call")


def has_output(choice: dict[str, Any]) -> bool:
    """The choice (a streamed chunk's or a buffered answer's) carries generated output."""
    delta = choice.get("delta")
    if delta is None:
        delta = choice.get("message")
    if type(delta) is dict:
        return any(delta.get(k) for k in _DELTA_OUTPUT)
    return bool(choice.get("text"))


def process_chunk(payload: bytes, st: StreamState, want_ids: bool) -> tuple[bytes, int]:
    """Digest one ``data:`` payload. Returns (payload to relay, tokens it carried): a choice's
    ``token_ids`` count one each; a choice without them counts 1 when it carries output of any
    kind (``has_output``)."""
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise StreamError("decode stream chunk is not JSON") from None
    if type(obj) is not dict:
        raise StreamError("decode stream chunk is not a JSON object")
    if "error" in obj:
        err = obj["error"]
        msg = err.get("message") if isinstance(err, dict) else err
        raise StreamError(f"engine error in stream: {msg}")
    changed = False
    ptids = obj.get("prompt_token_ids")
    if ptids is not None:
        if type(ptids) is list:
            st.prompt_tokens = len(ptids)
        if not want_ids:
            del obj["prompt_token_ids"]
            changed = True
    usage = obj.get("usage")
    if usage:
        st.usage = usage
    n = 0
    choices = obj.get("choices")
    if type(choices) is list:
        for ch in choices:
            if type(ch) is not dict:
                continue
            tids = ch.get("token_ids")
            if tids is not None:
                if type(tids) is not list:
                    raise StreamError("decode stream chunk has invalid token_ids")
                n += len(tids)
                if not want_ids:
                    del ch["token_ids"]
                    changed = True
            cp = ch.get("prompt_token_ids")
            if cp is not None:
                if type(cp) is list:
                    st.prompt_tokens = len(cp)
                if not want_ids:
                    del ch["prompt_token_ids"]
                    changed = True
            if tids is None and has_output(ch):
                n += 1
    st.tokens += n
    return (orjson.dumps(obj) if changed else payload), n


_TIDS = b',"token_ids":['
_ANY_TIDS = b'"token_ids":'


def _id_count(ids: bytes) -> int:
    """How many ids the inside of a ``[..]`` list of plain integers holds; -1 for anything else."""
    if ids.isdigit():  # the usual stream_interval=1 chunk: one token
        return 1
    if not ids:
        return 0
    if ids.replace(b",", b"").isdigit():
        return ids.count(b",") + 1
    return -1


def relay_chunk(payload: bytes, st: StreamState, want_ids: bool) -> tuple[bytes, int]:
    """``process_chunk`` for a streaming client, on bytes: count the choice's ``token_ids`` and cut
    them out without a JSON round trip when the chunk has the usual shape (one choice, with an
    ``index``, holding one compact ``,"token_ids":[ints]``; no ``error``; at most one compact
    ``prompt_token_ids`` list, counted and cut out the same way for a client that did not ask for
    ids). Anything else takes the full parse, so the result is the same either way."""
    if b'"error"' in payload:
        return process_chunk(payload, st, want_ids)
    if b"prompt_token" in payload:  # the first chunk of a stream (return_token_ids)
        cut = None if want_ids else _cut_prompt_ids(payload, st)
        if cut is None:
            return process_chunk(payload, st, want_ids)
        payload = cut
    i = payload.find(_TIDS)
    if i == -1:
        return process_chunk(payload, st, want_ids)
    start = i + 14
    end = payload.find(b"]", start)
    if end == -1 or payload.find(_ANY_TIDS, end) != -1 or payload.count(b'"index":') != 1:
        return process_chunk(payload, st, want_ids)
    n = _id_count(payload[start:end])
    if n < 0:
        return process_chunk(payload, st, want_ids)
    st.tokens += n
    return (payload if want_ids else payload[:i] + payload[end + 1 :]), n


_PTIDS = b',"prompt_token_ids":['
_DIGITS = b"0123456789"


def _cut_prompt_ids(payload: bytes, st: StreamState) -> bytes | None:
    """Count and cut out one compact ``,"prompt_token_ids":[ints]`` without parsing the prompt's
    ids (a long prompt's first chunk is mostly them); None for any other shape (a full parse)."""
    j = payload.find(_PTIDS)
    if j == -1 or payload.find(b"prompt_token", 0, j) != -1:
        return None
    k = payload.find(b"]", j + 21)
    if k == -1 or payload.find(b"prompt_token", k) != -1:  # (the list itself is digits and commas)
        return None
    n = id_list_count(payload, j + 21, k)  # (C, no copy: the ids are most of a long prompt's chunk)
    if n < 0:
        return None
    st.prompt_tokens = n
    return payload[:j] + payload[k + 1 :]


def id_list_count_py(data: bytes, start: int, end: int) -> int:
    """How many ids ``data[start:end]`` (the inside of a ``prompt_token_ids`` list) holds: commas + 1
    when it is only digits and commas, 0 when empty, else -1. ``_relay.id_list_count`` is the same
    in C (the tests compare them); this runs where the extension was not built."""
    if end <= start:
        return 0
    commas = data[start:end].translate(None, _DIGITS)  # what is left must be separators
    if commas.strip(b","):
        return -1
    return len(commas) + 1


def _native_id_list_count() -> Callable[[bytes, int, int], int]:
    try:
        from router.serving._relay import id_list_count as native
    except ImportError:
        return id_list_count_py
    return native


id_list_count = _native_id_list_count()


def relay_event(event: bytes, st: StreamState, want_ids: bool) -> bytes | None:
    """``relay_chunk`` fused with the SSE framing, for one whole body chunk that is exactly one
    single-line event ``data: {...}\n\n`` of the usual shape: returns the frame to relay (the
    event itself, or with the choice's ``token_ids`` cut out) and counts its tokens. None — and
    nothing counted — for anything else; the caller then takes the framer + ``relay_chunk`` path,
    which gives the same frames."""
    if not event.startswith(b"data: {") or not event.endswith(b"}\n\n"):
        return None
    i = event.find(_TIDS)
    if i == -1 or event.find(b"\n", 0, -2) != -1 or b"\r" in event or b'"error"' in event:
        return None
    start = i + 14
    end = event.find(b"]", start)
    if (
        end == -1
        or event.find(_ANY_TIDS, end) != -1
        or event.count(b'"index":') != 1
        or b"prompt_token" in event
    ):
        return None
    n = _id_count(event[start:end])
    if n < 0:
        return None
    st.tokens += n
    return event if want_ids else event[:i] + event[end + 1 :]
