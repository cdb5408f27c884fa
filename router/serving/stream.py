"""The streaming relay: decode-stream bytes → client transport, from the engine connection's callbacks.

Once the first token is out, the handler attaches a :class:`ClientRelay` to the engine response.
From then on every ``data_received`` of the engine connection runs ``on_raw`` (the usual token
chunks: one call to ``fastrelay.relay_read``, in C) or ``on_chunks`` / ``on_data`` (anything else:
SSE framing and the per-chunk byte work of ``relay_chunk``), and **one** write to the client for
everything that arrived together — no task wake-up, no timer, no JSON round trip per token. The
handler task sleeps on :attr:`ClientRelay.signal` and wakes only for the end of the stream, a failure, or back-pressure:
when the client's transport is over its high-water mark, reading from the engine is paused and the
handler waits (bounded by ``serving.client_write_timeout_s``) for the client to drain.
"""

from __future__ import annotations

import asyncio

from router.engines.legs import DecodeStream, LegFailure
from router.engines.wire import ResponseTooLarge, WireError
from router.serving.exchange import Paused
from router.serving.fastrelay import relay_read
from router.serving.relay import StreamError, StreamState, relay_chunk

DONE = "done"
BLOCKED = "blocked"
_DONE_FRAME = b"data: [DONE]\n\n"


class ClientGone(Exception):
    """The client's connection closed under the relay."""


class ClientRelay:
    __slots__ = (
        "_pending",
        "chunked",
        "finished",
        "framer",
        "loop",
        "protocol",
        "signal",
        "st",
        "stream",
        "tail",
        "transport",
        "want",
    )

    def __init__(
        self,
        stream: DecodeStream,
        transport: asyncio.Transport,
        protocol: Paused,  # the client connection: ``writing_paused`` says the client is behind
        chunked: bool,
        st: StreamState,
        want_ids: bool,
    ) -> None:
        self.stream = stream
        self.framer = stream.framer
        self.transport = transport
        self.protocol = protocol
        self.chunked = chunked
        self.st = st
        self.want = want_ids
        self.loop = asyncio.get_running_loop()
        self.signal: asyncio.Future[str] = self.loop.create_future()
        self._pending: str | BaseException | None = None  # a second event while the first is unread
        self.tail: list[bytes] = []  # frames for the handler's final write (with [DONE] and EOF)
        self.finished = False

    # -- the handler's side -------------------------------------------------------------------
    def start(self) -> None:
        self.stream.resp.attach(self)

    def rearm(self) -> None:
        """After the handler handled a BLOCKED signal: resume reading, wait for the next event."""
        self.signal = self.loop.create_future()
        pending, self._pending = self._pending, None
        if pending is not None:
            self._settle(pending)
        elif not self.finished:
            self.stream.resp.resume_reading()

    def detach(self) -> None:
        self.finished = True
        self.stream.resp.attach(None)

    # -- the engine connection's side (Listener) ----------------------------------------------
    def on_raw(self, data: bytes, budget: int) -> tuple[int, int]:
        """The whole plain token chunks the read starts with, relayed in one call and one write
        (``fastrelay.relay_read``); the rest of the read is for ``on_chunks`` / ``on_data``."""
        framer = self.framer
        if self.finished or framer.buf or framer.cr or framer.ready:
            return 0, 0
        out, tokens, used, body_bytes, _ = relay_read(data, self.want, self.chunked, budget)
        if not used:
            return 0, 0
        self.st.tokens += tokens
        self.transport.write(out)
        self._after_write()
        return used, body_bytes

    def on_chunks(self, bodies: list[bytes]) -> None:
        """Whole HTTP chunks that ``on_raw`` left: the first is never a plain token event (or the
        framer holds a partial event), so they take the framer path, in order."""
        self.on_data(bodies)

    def on_data(self, chunks: list[bytes]) -> None:
        if self.finished:
            return
        framer = self.framer
        for chunk in chunks:
            if framer.feed(chunk):
                break
        if framer.oversized:
            self._fail(LegFailure("stream", "decode", self.stream.iid, "stream event too large"))
            return
        self._relay(framer.take(), framer.done)

    def on_end(self) -> None:
        if self.finished:
            return
        framer = self.framer
        framer.eof()
        payloads = framer.take()
        if payloads or framer.done:
            self._relay(payloads, framer.done)
        if not self.finished:
            self._fail(LegFailure("stream", "decode", self.stream.iid, "stream ended without [DONE]"))

    def on_error(self, exc: BaseException) -> None:
        if self.finished:
            return
        iid = self.stream.iid
        if isinstance(exc, ResponseTooLarge):
            self._fail(LegFailure("response_limit", "decode", iid, str(exc)))
        elif isinstance(exc, TimeoutError):
            f = LegFailure("stream", "decode", iid, "decode read timed out")
            f.timed_out = True
            self._fail(f)
        elif isinstance(exc, WireError):
            self._fail(LegFailure("stream", "decode", iid, str(exc)))
        else:
            self._fail(exc)

    # -- work ---------------------------------------------------------------------------------
    def _relay(self, payloads: list[bytes], done: bool) -> None:
        frames: list[bytes] = []
        st, want = self.st, self.want
        for payload in payloads:
            try:
                out, _ = relay_chunk(payload, st, want)
            except StreamError as exc:
                self._write(frames)  # the good frames before the bad one, as they came
                self._fail(LegFailure("stream", "decode", self.stream.iid, str(exc)))
                return
            frames += (b"data: ", out, b"\n\n")
        if done:
            self.tail = frames
            self.tail.append(_DONE_FRAME)
            self.finished = True
            self._settle(DONE)
            return
        self._write(frames)
        self._after_write()

    def _after_write(self) -> None:
        """A closed client fails the relay; a client behind pauses the engine read (BLOCKED)."""
        if self.transport.is_closing():
            self._fail(ClientGone("client disconnected"))
        elif self.protocol.writing_paused:
            self.stream.resp.pause_reading()
            self._settle(BLOCKED)

    def _write(self, frames: list[bytes]) -> None:
        if not frames:
            return
        data = b"".join(frames)
        if self.chunked:
            data = b"%x\r\n%b\r\n" % (len(data), data)
        self.transport.write(data)

    def _fail(self, exc: BaseException) -> None:
        self.finished = True
        self._settle(exc)

    def _settle(self, what: str | BaseException) -> None:
        sig = self.signal
        if sig.done():
            if self._pending is None or isinstance(what, BaseException):
                self._pending = what
            return
        if isinstance(what, BaseException):
            sig.set_exception(what)
        else:
            sig.set_result(what)
