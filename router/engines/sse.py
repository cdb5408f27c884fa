"""Server-sent-event framing of a decode stream over raw body chunks. Pure.

Events end with a blank line; lines may end with CRLF, CR or LF (the SSE specification allows all
three), so CR and CRLF are turned into LF before splitting — also when a CRLF pair is cut between
two chunks. LF-only streams (the common case) skip that step.
"""

from __future__ import annotations

_SEP = b"\n\n"
MAX_EVENT = 1 << 20  # one SSE event larger than this is a broken stream, not a token


def event_payload(event: bytes, unterminated: bool = False) -> bytes | None:
    """The data of one SSE event (without its blank-line terminator); None when it has none.

    ``unterminated``: the bytes left at EOF, framed as the per-event reader this replaced did.
    """
    if event.startswith(b"data:") and (
        event.count(b"\n", 0, -2) == 0 if unterminated else b"\n" not in event
    ):
        return event[5:].strip()
    # multi-line event: comments, event names, several data lines
    payload = b"\n".join(line[5:].strip() for line in event.splitlines() if line.startswith(b"data:"))
    return payload or None


class SSEFramer:
    """Feed body chunks; complete ``data`` payloads collect in ``ready`` until ``[DONE]``."""

    __slots__ = ("buf", "cr", "done", "ready")

    def __init__(self) -> None:
        self.buf = bytearray()  # bytes of an incomplete event
        self.cr = False  # the last chunk ended with CR (already turned into LF)
        self.done = False  # [DONE] seen; anything after it is ignored
        self.ready: list[bytes] = []  # complete payloads not handed out yet

    def feed(self, chunk: bytes) -> bool:
        """Frame ``chunk``; True once ``[DONE]`` was reached (the rest of the chunk is dropped)."""
        if self.done:
            return True
        if not self.buf and not self.cr and chunk.endswith(_SEP) and chunk.startswith(b"data:"):
            end = len(chunk) - 2
            if chunk.find(b"\n", 0, end) == -1 and b"\r" not in chunk:
                # the usual body chunk: exactly one single-line event (what event_payload does)
                payload = chunk[5:end].strip()
                if payload == b"[DONE]":
                    self.done = True
                    return True
                self.ready.append(payload)
                return False
        if self.cr:
            self.cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if b"\r" in chunk:
            self.cr = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self.buf
        if not buf:  # no partial event: the chunk's events, without a copy of the chunk
            start = 0
            while (end := chunk.find(_SEP, start)) != -1:
                if self._add(chunk[start:end]):
                    return True
                start = end + 2
            buf += memoryview(chunk)[start:]
            return False
        # A partial event grows in place and is searched from its last byte only (it holds no
        # blank line): an event cut into many small chunks costs what its bytes cost, not their
        # square (1-byte chunks of a long event would hold the event loop).
        at = len(buf) - 1
        buf += chunk
        start = 0
        while (end := buf.find(_SEP, at)) != -1:
            if self._add(bytes(buf[start:end])):
                buf.clear()
                return True
            start = at = end + 2
        if start:
            del buf[:start]
        return False

    def eof(self) -> None:
        """The body ended: an unterminated last event still counts (like a ``readuntil``)."""
        tail = bytes(self.buf)
        self.buf.clear()
        if tail and not self.done:
            self._add(tail, unterminated=True)

    @property
    def oversized(self) -> bool:
        return len(self.buf) > MAX_EVENT

    def take(self) -> list[bytes]:
        out = self.ready
        self.ready = []
        return out

    def _add(self, event: bytes, unterminated: bool = False) -> bool:
        payload = event_payload(event, unterminated)
        if payload is None:
            return False
        if payload == b"[DONE]":
            self.done = True
            return True
        self.ready.append(payload)
        return False
