"""Decode-stream SSE framing: splitting raw body chunks on blank lines gives the same events as the
per-event ``readuntil(b"\\n\\n")`` reader it replaced, however the body is cut into chunks."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any
from unittest import mock

import aiohttp
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from router.engines.legs import DecodeStream, LegFailure

# -- the reference: the previous DecodeStream.next_data (one readuntil per event) ----------------


async def _reference_next_data(content: aiohttp.StreamReader) -> bytes | None:
    while True:
        event = await content.readuntil(b"\n\n")
        if not event:
            raise LegFailure("stream", "decode", "e", "stream ended without [DONE]")
        if event.startswith(b"data:") and event.count(b"\n", 0, -2) == 0:
            payload = event[5:].strip()
        else:
            payload = b"\n".join(line[5:].strip() for line in event.splitlines() if line.startswith(b"data:"))
            if not payload:
                continue
        if payload == b"[DONE]":
            return None
        return payload


def _reader(chunks: list[bytes]) -> aiohttp.StreamReader:
    reader = aiohttp.StreamReader(mock.Mock(_reading_paused=False), 2**16, loop=asyncio.get_running_loop())
    for c in chunks:
        reader.feed_data(c)
    reader.feed_eof()
    return reader


async def _reference(chunks: list[bytes]) -> tuple[list[bytes], str]:
    content = _reader(chunks)
    out: list[bytes] = []
    try:
        while (p := await _reference_next_data(content)) is not None:
            out.append(p)
    except LegFailure as f:
        return out, f.detail
    return out, "done"


async def _one_by_one(chunks: list[bytes]) -> tuple[list[bytes], str]:
    stream = DecodeStream(SimpleNamespace(content=_reader(chunks)), "e")  # type: ignore[arg-type]
    out: list[bytes] = []
    try:
        while (p := await stream.next_data()) is not None:
            out.append(p)
    except LegFailure as f:
        return out, f.detail
    return out, "done"


async def _batched(chunks: list[bytes]) -> tuple[list[bytes], str]:
    stream = DecodeStream(SimpleNamespace(content=_reader(chunks)), "e")  # type: ignore[arg-type]
    out: list[bytes] = []
    try:
        while True:
            payloads, done = await stream.next_events()
            assert payloads or done  # next_events waits for at least one event
            out += payloads
            if done:
                return out, "done"
    except LegFailure as f:
        return out, f.detail


def _check(body: bytes, cuts: list[int]) -> None:
    points = sorted({c % (len(body) + 1) for c in cuts})
    chunks = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True) if b > a]

    async def run() -> None:
        want = await _reference(chunks)
        assert await _one_by_one(chunks) == want
        assert await _batched(chunks) == want

    asyncio.run(run())


# -- generated streams ------------------------------------------------------------------------------
_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
_doc: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {"id": st.just("cmpl-1"), "choices": st.lists(st.fixed_dictionaries({"text": _text}), max_size=2)},
    optional={"token_ids": st.lists(st.integers(0, 2**20), max_size=3), "note": _text},
)
_event = st.one_of(
    _doc.map(lambda d: b"data: " + orjson.dumps(d)),
    _doc.map(lambda d: b"data:" + orjson.dumps(d)),  # no space after the colon
    st.just(b"data: [DONE]"),
    st.just(b": keep-alive"),
    st.just(b"event: ping"),
    st.just(b""),
    st.just(b"data:"),
    st.tuples(_doc, _doc).map(lambda t: b"data: " + orjson.dumps(t[0]) + b"\ndata: " + orjson.dumps(t[1])),
    _doc.map(lambda d: b"event: message\ndata: " + orjson.dumps(d)),
    st.just(b"data: not json"),
)


@settings(max_examples=150, deadline=None)
@given(
    events=st.lists(_event, max_size=8),
    tail=st.sampled_from([b"\n\n", b"", b"\n", b"\n\n\n"]),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
)
def test_framing_matches_per_event_reader(events: list[bytes], tail: bytes, cuts: list[int]) -> None:
    _check(b"\n\n".join(events) + tail, cuts)


def test_framing_examples() -> None:
    frame = b'data: {"choices":[{"text":"a\\n\\nb","token_ids":[1]}]}\n\n'
    for cuts in ([], [1], [6], [len(frame) - 1], list(range(len(frame)))):
        _check(frame * 3 + b"data: [DONE]\n\n", cuts)
    _check(frame + b"data: [DONE]\n\n" + frame, [])  # events after [DONE] are ignored
    _check(frame, [3])  # no [DONE]: a stream failure after the frames
    _check(frame + b"data: {}", [])  # an unterminated last event still counts


def test_batches_hold_every_event_already_received() -> None:
    async def run() -> None:
        frames = [b'data: {"n":%d}\n\n' % i for i in range(3)]
        stream = DecodeStream(SimpleNamespace(content=_reader([b"".join(frames) + b"data: [DONE]\n\n"])), "e")  # type: ignore[arg-type]
        first = await stream.next_data()
        assert first == b'{"n":0}'
        assert stream.ready() == ([b'{"n":1}', b'{"n":2}'], True)
        assert await stream.next_events() == ([], True)
        assert await stream.next_data() is None

    asyncio.run(run())


# -- CRLF / CR line ends and the byte-level relay ----------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(
    events=st.lists(_event, max_size=8),
    eol=st.sampled_from([b"\r\n", b"\r"]),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
)
def test_crlf_and_cr_framing_gives_the_lf_events(events: list[bytes], eol: bytes, cuts: list[int]) -> None:
    lf = b"\n\n".join(events) + b"\n\n"
    body = lf.replace(b"\n", eol)
    points = sorted({c % (len(body) + 1) for c in cuts})
    chunks = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True) if b > a]

    async def run() -> None:
        assert await _one_by_one(chunks) == await _reference([lf])

    asyncio.run(run())


_chunk_doc = st.fixed_dictionaries(
    {
        "id": st.just("cmpl-1"),
        "choices": st.lists(
            st.fixed_dictionaries(
                {"index": st.just(0), "text": _text},
                optional={
                    "token_ids": st.lists(st.integers(0, 2**20), max_size=4),
                    "finish_reason": st.sampled_from([None, "length"]),
                    "prompt_token_ids": st.lists(st.integers(0, 9), max_size=2),
                },
            ),
            max_size=2,
        ),
    },
    optional={"usage": st.just({"prompt_tokens": 1}), "error": st.just({"message": "boom"})},
)


@settings(max_examples=300, deadline=None)
@given(doc=_chunk_doc, want=st.booleans(), first=st.booleans())
def test_byte_relay_matches_the_json_relay(doc: dict[str, Any], want: bool, first: bool) -> None:
    from router.serving.relay import StreamError, StreamState, process_chunk, relay_chunk

    if first and doc["choices"]:  # token_ids as the first key of a choice
        ch = doc["choices"][0]
        doc["choices"][0] = {"token_ids": ch.pop("token_ids", [1]), **ch}
    payload = orjson.dumps(doc)
    a, b = StreamState(), StreamState()
    try:
        want_out, want_n = process_chunk(payload, a, want)
    except StreamError:
        try:
            relay_chunk(payload, b, want)
        except StreamError:
            return
        raise AssertionError("relay_chunk accepted an error chunk") from None
    out, n = relay_chunk(payload, b, want)
    assert (orjson.loads(out), n, b.tokens) == (orjson.loads(want_out), want_n, a.tokens)
