"""The relay's fast path — one whole HTTP chunk holding one plain token event skips the HTTP parser,
the SSE framer and ``relay_chunk`` — gives the client exactly the bytes, token count and outcome of
the general path, however the engine's body is cut into HTTP chunks and into reads."""

from __future__ import annotations

import asyncio
import itertools
from types import SimpleNamespace
from typing import Any
from unittest import mock

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from router.engines import wire as engine_wire
from router.engines.legs import DecodeStream, LegFailure
from router.engines.sse import SSEFramer
from router.engines.wire import EngineConnection, EnginePool, whole_chunks
from router.serving import relay as relay_module
from router.serving.fastrelay import NATIVE, NATIVE_PROBLEM, RelayRead, relay_read, relay_read_py
from router.serving.relay import (
    StreamError,
    StreamState,
    id_list_count_py,
    process_chunk,
    relay_chunk,
    relay_event,
)
from router.serving.stream import ClientRelay

_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _token_doc(tids: list[int], text: str = " a", extra: dict[str, Any] | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": None, "text": text}
    choice["token_ids"] = tids
    return {"id": "cmpl-1", "object": "text_completion", "choices": [choice], **(extra or {})}


_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=8)
_tids = st.lists(st.integers(0, 2**20), max_size=3)
_payload = st.one_of(
    st.builds(lambda t, x: orjson.dumps(_token_doc(t, x)), _tids, _text),  # the usual token chunk
    st.builds(lambda t: orjson.dumps(_token_doc(t, extra={"usage": {"prompt_tokens": 1}})), _tids),
    st.builds(
        lambda t: orjson.dumps({"choices": [{"index": 0, "token_ids": t, "prompt_token_ids": [1, 2]}]}),
        _tids,
    ),
    st.builds(
        lambda t: orjson.dumps({"choices": [{"index": 0, "token_ids": t}, {"index": 1, "token_ids": t}]}),
        _tids,
    ),
    st.just(b'{"choices":[{"index":0,"text":" b"}]}'),  # no token_ids: counted by text
    st.just(b'{"error":{"message":"boom"}}'),
    st.just(b"not json"),
)
_event = st.one_of(
    _payload.map(lambda p: b"data: " + p + b"\n\n"),
    _payload.map(lambda p: b"data:" + p + b"\n\n"),  # no space after the colon
    _payload.map(lambda p: b"data: " + p + b" \n\n"),  # trailing blank
    _payload.map(lambda p: b"data: " + p + b"\r\n\r\n"),
    _payload.map(lambda p: b": keep-alive\ndata: " + p + b"\n\n"),
    st.just(b": ping\n\n"),
)


def _reference_frames(events: list[bytes], want: bool) -> tuple[bytes, str, int]:
    """What the general path sends: framer → relay_chunk per payload → ``data: <out>\\n\\n``."""
    framer, state, out = SSEFramer(), StreamState(), b""
    for ev in events:
        done = framer.feed(ev)
        for p in framer.take():
            try:
                frame, _ = relay_chunk(p, state, want)
            except StreamError:
                return out, "error", state.tokens
            out += b"data: " + frame + b"\n\n"
        if done:
            return out + b"data: [DONE]\n\n", "done", state.tokens
    return out, "cut", state.tokens


@settings(max_examples=300, deadline=None)
@given(event=_event, want=st.booleans())
def test_relay_event_gives_the_general_paths_frame(event: bytes, want: bool) -> None:
    fast = StreamState()
    frame = relay_event(event, fast, want)
    ref, outcome, tokens = _reference_frames([event], want)
    if frame is None:
        assert fast.tokens == 0  # nothing counted: the general path will count it
        return
    assert outcome == "cut" and frame == ref and fast.tokens == tokens


class _Transport:
    def __init__(self) -> None:
        self.data = bytearray()
        self.closing = False

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return self.closing

    def abort(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str) -> None:
        return None


class _PausingTransport(_Transport):
    def __init__(self) -> None:
        super().__init__()
        self.paused = False

    def pause_reading(self) -> None:
        assert not self.paused
        self.paused = True

    def resume_reading(self) -> None:
        assert self.paused
        self.paused = False


def _dechunk(data: bytes) -> bytes:
    out, pos = b"", 0
    while pos < len(data):
        eol = data.index(b"\r\n", pos)
        n = int(data[pos:eol], 16)
        out += data[eol + 2 : eol + 2 + n]
        assert data[eol + 2 + n : eol + 4 + n] == b"\r\n"
        pos = eol + 4 + n
    return out


class _CountingRelay(ClientRelay):
    __slots__ = ("fast_chunks", "impl")
    fast_chunks: int
    impl: RelayRead

    def on_chunks(self, bodies: list[bytes]) -> None:
        self.fast_chunks += len(bodies)
        super().on_chunks(bodies)

    def on_raw(self, data: bytes, budget: int) -> tuple[int, int]:
        def counted(data: bytes, want: bool, chunked: bool, budget: int) -> tuple[bytes, int, int, int, int]:
            result = self.impl(data, want, chunked, budget)
            self.fast_chunks += result[4]
            return result

        with mock.patch("router.serving.stream.relay_read", counted):
            return super().on_raw(data, budget)


_IMPLS: list[RelayRead] = [relay_read_py] + ([NATIVE] if NATIVE is not None else [])


def test_the_native_relay_loop_is_built() -> None:
    """``pip install`` builds ``_relay.c`` where a C compiler is (the project's machines): the
    router's per-token loop is the C one, not its slower Python twin."""
    assert NATIVE is not None, NATIVE_PROBLEM
    assert relay_read is NATIVE


async def _handled(conn: EngineConnection) -> None:
    """Until the connection has handled the whole read: a read over ``READ_SLICE`` is handled a
    slice per event-loop iteration."""
    for _ in range(-(-len(conn.backlog) // engine_wire.READ_SLICE)):
        await asyncio.sleep(0)  # one turn of the loop
    assert not conn.backlog


async def _relay(
    reads: list[bytes], want: bool, early: int = 0, impl: RelayRead = relay_read
) -> tuple[bytes, str, int, int]:
    """Relay ``reads`` to a client; the first ``early`` of them arrive before the relay attaches."""
    loop = asyncio.get_running_loop()
    conn = EngineConnection(EnginePool(1.0), ("127.0.0.1", 1), loop)
    conn.connection_made(_Transport())  # type: ignore[arg-type]
    resp = conn.send(b"", 1 << 20)
    client, state = _Transport(), StreamState()
    relay = _CountingRelay(
        DecodeStream(resp, "e"),
        client,  # type: ignore[arg-type]
        SimpleNamespace(writing_paused=False),
        True,
        state,
        want,
    )
    relay.fast_chunks = 0
    relay.impl = impl
    for r in reads[:early]:
        conn.data_received(r)
        await _handled(conn)
    relay.start()
    for r in reads[early:]:
        if relay.finished:
            break
        conn.data_received(r)
        await _handled(conn)
    if not relay.finished:
        conn.connection_lost(None)
    sent = _dechunk(bytes(client.data)) + b"".join(relay.tail)
    sig = relay.signal
    if not sig.done():
        outcome = "pending"
    elif sig.exception() is None:
        outcome = "done"
    else:
        exc = sig.exception()
        assert isinstance(exc, LegFailure)
        outcome = "cut" if exc.detail == "stream ended without [DONE]" else "error"
    return sent, outcome, state.tokens, relay.fast_chunks


def _http_chunks(events: list[bytes], groups: list[int], upper: bool) -> list[bytes]:
    """The body as HTTP chunks: events joined or split per ``groups`` (the engine's writes)."""
    body = b"".join(events)
    cuts = sorted({g % (len(body) + 1) for g in groups} | {0, len(body)})
    out = []
    for a, b in itertools.pairwise(cuts):
        part = body[a:b]
        size = (b"%X" if upper else b"%x") % len(part)
        out.append(size + b"\r\n" + part + b"\r\n")
    return out


@settings(max_examples=200, deadline=None)
@given(
    events=st.lists(_event, max_size=6),
    done=st.booleans(),
    want=st.booleans(),
    upper=st.booleans(),
    groups=st.lists(st.integers(0, 5000), max_size=4),
    cuts=st.lists(st.integers(0, 5000), max_size=8),
    early=st.integers(0, 3),
    read_slice=st.sampled_from([engine_wire.READ_SLICE, 1, 2, 7, 64]),
)
def test_client_bytes_do_not_depend_on_chunking_or_reads(
    events: list[bytes],
    done: bool,
    want: bool,
    upper: bool,
    groups: list[int],
    cuts: list[int],
    early: int,
    read_slice: int,
) -> None:
    """... nor on how much of a read the connection handles per event-loop iteration."""
    events = [*events, b"data: [DONE]\n\n"] if done else events
    ref = _reference_frames(events, want)
    per_event = [c for ev in events for c in _http_chunks([ev], [], upper)]
    wire = _HEAD + b"".join(_http_chunks(events, groups, upper)) + b"0\r\n\r\n"
    points = sorted({c % (len(wire) + 1) for c in cuts} | {0, len(wire)})
    runs = {
        "one read per event chunk": [_HEAD, *per_event, b"0\r\n\r\n"],
        "everything in one read": [_HEAD + b"".join(per_event) + b"0\r\n\r\n"],
        "first event alone, then the rest in one read": [
            _HEAD,
            *per_event[:1],
            b"".join(per_event[1:]),
            b"0\r\n\r\n",
        ],
        "engine chunks, cut reads": [wire[a:b] for a, b in itertools.pairwise(points)],
    }

    async def run() -> None:
        for name, reads in runs.items():
            for impl in _IMPLS:
                sent, outcome, tokens, _ = await _relay(reads, want, early, impl)
                assert (sent, outcome, tokens) == ref, (name, impl)

    with mock.patch.object(engine_wire, "READ_SLICE", read_slice):
        asyncio.run(run())


def test_one_read_of_one_byte_chunks_is_handled_a_slice_per_loop_iteration() -> None:
    """An engine sending 1-byte HTTP chunks (one long event, then many token events) in reads of
    256 KiB: each event-loop callback handles at most ``READ_SLICE`` bytes of a read (body bytes
    counted between two turns of a ticker on the same loop), the transport is paused meanwhile,
    and the client gets what a well-chunked engine gives it."""
    events = [b"data: " + orjson.dumps(_token_doc([1], text="x" * 100_000)) + b"\n\n"]
    events += [b"data: " + orjson.dumps(_token_doc([i])) + b"\n\n" for i in range(500)]
    events.append(b"data: [DONE]\n\n")
    body = b"".join(events)
    one_byte = b"".join(b"1\r\n%c\r\n" % c for c in body) + b"0\r\n\r\n"
    reads = [_HEAD + one_byte[:100]] + [one_byte[i : i + 262144] for i in range(100, len(one_byte), 262144)]

    async def run() -> tuple[list[int], bytes, StreamState, bool]:
        loop = asyncio.get_running_loop()
        conn = EngineConnection(EnginePool(1.0), ("127.0.0.1", 1), loop)
        engine = _PausingTransport()
        conn.connection_made(engine)  # type: ignore[arg-type]
        resp = conn.send(b"", 1 << 30)
        client, state = _Transport(), StreamState()
        relay = ClientRelay(
            DecodeStream(resp, "e"),
            client,  # type: ignore[arg-type]
            SimpleNamespace(writing_paused=False),
            True,
            state,
            False,
        )
        relay.start()
        seen: list[int] = []

        def tick() -> None:
            seen.append(resp.received)
            if not relay.finished:
                loop.call_soon(tick)

        loop.call_soon(tick)
        for r in reads:
            assert not engine.paused  # the transport reads again once a read is handled
            conn.data_received(r)
            assert engine.paused == (len(r) > engine_wire.READ_SLICE)
            await _handled(conn)
            await asyncio.sleep(0)
        assert relay.finished and relay.signal.result() == "done"
        return seen, _dechunk(bytes(client.data)) + b"".join(relay.tail), state, engine.paused

    seen, sent, state, paused = asyncio.run(run())
    steps = [b - a for a, b in itertools.pairwise(seen)]
    assert max(steps) <= engine_wire.READ_SLICE // 6 + 1  # ~6 wire bytes per body byte
    assert max(steps) * 20 < len(body)  # no callback handled more than a twentieth of the stream
    assert len([s for s in steps if s]) >= len(one_byte) // engine_wire.READ_SLICE
    assert (state.tokens, paused) == (501, False)
    ref, outcome, tokens = _reference_frames(events, False)
    assert (outcome, tokens) == ("done", 501)
    assert sent == ref


def test_plain_token_chunks_take_the_fast_path() -> None:
    events = [b"data: " + orjson.dumps(_token_doc([i])) + b"\n\n" for i in range(5)]
    events.append(b"data: [DONE]\n\n")
    reads = [_HEAD, *(c for ev in events for c in _http_chunks([ev], [], False)), b"0\r\n\r\n"]

    async def run() -> tuple[bytes, str, int, int]:
        return await _relay(reads, False)

    sent, outcome, tokens, fast = asyncio.run(run())
    assert (outcome, tokens) == ("done", 5)
    assert fast == 5  # every chunk after the first one skipped the parser (the 4 tokens and [DONE])
    assert b"token_ids" not in sent and sent.count(b"data: ") == 6


def test_several_token_chunks_in_one_read_take_the_fast_path_with_one_write() -> None:
    events = [b"data: " + orjson.dumps(_token_doc([i])) + b"\n\n" for i in range(5)]
    chunks = [c for ev in events for c in _http_chunks([ev], [], False)]
    reads = [_HEAD, chunks[0], b"".join(chunks[1:]), b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"]

    async def run() -> tuple[bytes, str, int, int]:
        return await _relay(reads, True)

    sent, outcome, tokens, fast = asyncio.run(run())
    assert (outcome, tokens, fast) == ("done", 5, 5)  # 4 tokens and [DONE]; the last chunk: parser
    assert sent == b"".join(events) + b"data: [DONE]\n\n"  # token_ids kept: the client asked


def test_whole_chunks() -> None:
    assert whole_chunks(b"3\r\nabc\r\n") == ([b"abc"], 8)
    assert whole_chunks(b"3\r\nabc\r\nA\r\n0123456789\r\n") == ([b"abc", b"0123456789"], 23)
    assert whole_chunks(b"a\r\n0123456789\r\n") == ([b"0123456789"], 15)
    assert whole_chunks(b"3\r\nabc\r\n4\r\nab") == ([b"abc"], 8)  # whole, then cut: the rest is the parser's
    assert whole_chunks(b"3\r\nabc\r\n0\r\n\r\n") == ([b"abc"], 8)  # ... and so is the last chunk
    for other in (
        b"",
        b"3\r\nab",  # cut
        b"3\r\nabc\r",
        b"3;ext=1\r\nabc\r\n",  # chunk extension: the parser's job
        b"0\r\n\r\n",  # the last chunk ends the message: the parser's job
        b"3\r\nabcd\r\n",  # data longer than its size
        b"0x3\r\nabc\r\n",
        b" 3\r\nabc\r\n",
        b"\r\n3\r\nabc\r\n",
    ):
        assert whole_chunks(other) == ([], 0), other


_ids = st.lists(st.integers(0, 2**31), max_size=40)


@settings(max_examples=300, deadline=None)
@given(
    tids=st.one_of(st.none(), _ids),
    ptids=_ids,
    where=st.sampled_from(["choice", "top", "both", "first"]),
    want=st.booleans(),
)
def test_prompt_ids_cut_on_bytes_match_the_json_relay(
    tids: list[int] | None, ptids: list[int], where: str, want: bool
) -> None:
    """The first chunk of a stream carries the prompt's ids (``return_token_ids``): counted and cut
    out on bytes, the result is the full parse's, wherever the engine put them."""
    choice: dict[str, Any] = {"index": 0, "text": " a", "finish_reason": None}
    if tids is not None:
        choice["token_ids"] = tids
    doc: dict[str, Any] = {"id": "cmpl-1", "choices": [choice]}
    if where in ("choice", "both"):
        choice["prompt_token_ids"] = ptids
    if where in ("top", "both"):
        doc["prompt_token_ids"] = ptids
    if where == "first":
        doc = {"prompt_token_ids": ptids, **doc}
    payload = orjson.dumps(doc)
    a, b = StreamState(), StreamState()
    want_out, want_n = process_chunk(payload, a, want)
    out, n = relay_chunk(payload, b, want)
    assert (orjson.loads(out), n, b.tokens, b.prompt_tokens) == (
        orjson.loads(want_out),
        want_n,
        a.tokens,
        a.prompt_tokens,
    )


def test_a_long_prompts_ids_are_cut_without_a_full_parse() -> None:
    payload = orjson.dumps(
        {
            "id": "c",
            "choices": [{"index": 0, "text": " a", "token_ids": [7], "prompt_token_ids": list(range(4000))}],
        }
    )
    state = StreamState()
    with mock.patch("router.serving.relay.process_chunk", side_effect=AssertionError("full parse")):
        out, n = relay_chunk(payload, state, False)
    assert orjson.loads(out) == {"id": "c", "choices": [{"index": 0, "text": " a"}]}
    assert (n, state.tokens, state.prompt_tokens) == (1, 1, 4000)


@settings(max_examples=300, deadline=None)
@given(
    data=st.one_of(
        st.binary(max_size=80),
        st.lists(st.integers(0, 10**6), max_size=300).map(lambda ids: orjson.dumps(ids)[1:-1]),
        st.tuples(
            st.lists(st.integers(0, 10**6), min_size=30, max_size=300),
            st.integers(0),
            st.binary(min_size=1, max_size=1),
        ).map(
            lambda t: (lambda ids: ids[: t[1] % len(ids)] + t[2] + ids[t[1] % len(ids) :])(
                orjson.dumps(t[0])[1:-1]
            )
        ),  # a long list with one other byte anywhere (past the C loop's 128-byte blocks too)
        st.text(alphabet="0123456789, ]x", max_size=40).map(str.encode),
    ),
    start=st.integers(0, 3000),
    stop=st.integers(0, 3000),
)
def test_native_prompt_id_count_is_the_python_one(data: bytes, start: int, stop: int) -> None:
    """The prompt ids of a first chunk are counted by ``_relay.id_list_count`` (no copy of the ids):
    the same count as ``id_list_count_py`` for any slice of any bytes, ids lists or not."""
    from router.serving._relay import id_list_count as native

    a, b = sorted((start % (len(data) + 1), stop % (len(data) + 1)))
    assert relay_module.id_list_count is native
    assert native(data, a, b) == id_list_count_py(data, a, b)
    assert native(data, 0, len(data)) == id_list_count_py(data, 0, len(data))


@settings(max_examples=400, deadline=None)
@given(
    events=st.lists(_event, max_size=6),
    groups=st.lists(st.integers(0, 5000), max_size=4),
    start=st.integers(0, 5000),
    stop=st.integers(0, 5000),
    upper=st.booleans(),
    want=st.booleans(),
    chunked=st.booleans(),
    budget=st.integers(0, 2000),
)
def test_native_relay_read_is_the_python_one(
    events: list[bytes],
    groups: list[int],
    start: int,
    stop: int,
    upper: bool,
    want: bool,
    chunked: bool,
    budget: int,
) -> None:
    """The C loop returns what ``relay_read_py`` (whole_chunks + relay_event) returns, for any read:
    whole engine chunks, cut ones, a read starting mid-chunk, a response limit in the way."""
    assert NATIVE is not None, NATIVE_PROBLEM
    wire = b"".join(_http_chunks(events, groups, upper)) + b"0\r\n\r\n"
    a, b = sorted((start % (len(wire) + 1), stop % (len(wire) + 1)))
    for data in (wire, wire[:b], wire[a:b]):
        assert NATIVE(data, want, chunked, budget) == relay_read_py(data, want, chunked, budget)
        assert NATIVE(data, want, chunked, 1 << 30) == relay_read_py(data, want, chunked, 1 << 30)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300), want=st.booleans())
def test_native_relay_read_on_any_bytes(data: bytes, want: bool) -> None:
    assert NATIVE is not None, NATIVE_PROBLEM
    assert NATIVE(data, want, True, 1 << 20) == relay_read_py(data, want, True, 1 << 20)


_hex_size = st.one_of(
    st.integers(0, 2**32 - 1).map(lambda n: b"%x" % n),
    st.sampled_from([b"ffffffff", b"FFFFFFFF", b"7fffffff", b"80000000", b"10000000", b"fffffff0"]),
)


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(_event, min_size=1, max_size=4),
    size=_hex_size,
    which=st.integers(0, 3),
    slack=st.integers(-3, 3),
    want=st.booleans(),
)
def test_native_relay_read_refuses_a_chunk_size_beyond_the_read(
    events: list[bytes], size: bytes, which: int, slack: int, want: bool
) -> None:
    """A chunk size larger than what is left of the read — up to 8 hex digits, ``ffffffff`` past a
    32-bit ``Py_ssize_t`` — is no whole chunk: the C loop stops there like the Python one (the size
    is refused before it is added, so nothing overflows), and so does one just over the data."""
    assert NATIVE is not None, NATIVE_PROBLEM
    chunks = _http_chunks(events, [], False)
    which %= len(chunks)
    body = b"".join(events)
    near = b"%x" % max(1, len(body) + slack)  # around the real size: just fits, or just not
    for field in (size, near):
        cut = chunks[which].index(b"\r\n")
        forged = [*chunks[:which], field + chunks[which][cut:], *chunks[which + 1 :]]
        for data in (b"".join(forged), b"".join(forged) + b"0\r\n\r\n"):
            for budget in (1 << 30, 2**63 - 1):
                assert NATIVE(data, want, True, budget) == relay_read_py(data, want, True, budget)


def test_relay_read_at_the_edges_of_a_chunk_size() -> None:
    ev = b"data: " + orjson.dumps(_token_doc([7])) + b"\n\n"
    whole = b"%x\r\n%b\r\n" % (len(ev), ev)
    for impl in _IMPLS:
        for data in (
            b"ffffffff\r\n" + ev + b"\r\n",
            b"7fffffff\r\n" + ev + b"\r\n",
            b"5\r\n",  # the size line ends the read
            b"1\r\n\r\n",
            b"%x\r\n%b\r\n" % (len(ev) + 1, ev),  # one byte over what is there
            whole[:-1],
        ):
            assert impl(data, False, True, 2**63 - 1) == (b"", 0, 0, 0, 0), (impl, data)
        assert impl(whole, True, False, 2**63 - 1) == (ev, 1, len(whole), len(ev), 1)


def test_relay_read_takes_whole_plain_chunks_and_leaves_the_rest() -> None:
    tok = [b"data: " + orjson.dumps(_token_doc([i])) + b"\n\n" for i in (7, 8)]
    chunks = [c for ev in tok for c in _http_chunks([ev], [], False)]
    done = b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
    for impl in _IMPLS:
        out, tokens, used, body, n = impl(chunks[0] + chunks[1] + done, False, False, 1 << 20)
        assert (tokens, used, body, n) == (2, len(chunks[0]) + len(chunks[1]), len(tok[0]) + len(tok[1]), 2)
        assert out == b"".join(
            t.replace(b',"token_ids":[7]', b"").replace(b',"token_ids":[8]', b"") for t in tok
        )
        out, *_ = impl(chunks[0], True, True, 1 << 20)
        assert out == b"%x\r\n%b\r\n" % (len(tok[0]), tok[0])  # one HTTP chunk, the ids kept
        assert impl(done, False, False, 1 << 20) == (b"", 0, 0, 0, 0)  # [DONE]: the general path's
        assert impl(chunks[0] + chunks[1], False, False, len(tok[0])) == (b"", 0, 0, 0, 0)  # over the limit
