"""One engine read's whole plain token chunks → the bytes for the client, in one call. Pure.

``relay_read(data, want_ids, chunked, budget)`` takes the whole HTTP chunks at the start of
``data`` (what ``wire.whole_chunks`` takes) as long as each is one plain token event (what
``relay.relay_event`` relays), and returns ``(out, tokens, used, body_bytes, chunks)``: the frames
joined (``token_ids`` cut out unless the client asked for them), as one HTTP chunk when
``chunked``; the tokens they carried; how many bytes of ``data`` they took; their body bytes; how
many chunks. It takes nothing — ``(b"", 0, 0, 0, 0)`` — when the first chunk is not plain, or when
the whole chunks of the read hold more than ``budget`` body bytes (the response limit: the general
path fails the response, as it would have). Whatever it leaves is the general path's, from a chunk
boundary, so the client's bytes are the same either way.

The loop runs per read of every relayed stream, so it is in C (``_relay.c``, built by
``pip install``); ``relay_read_py`` is the same in Python — the reference the tests compare the C
version with, and what runs where the extension could not be built (``NATIVE_PROBLEM`` says why;
the router logs it at start-up).
"""

from __future__ import annotations

from collections.abc import Callable

from router.engines.wire import whole_chunks
from router.serving.relay import StreamState, relay_event

RelayRead = Callable[[bytes, bool, bool, int], tuple[bytes, int, int, int, int]]


def relay_read_py(
    data: bytes, want_ids: bool, chunked: bool, budget: int
) -> tuple[bytes, int, int, int, int]:
    bodies, _ = whole_chunks(data)
    if sum(map(len, bodies)) > budget:
        return b"", 0, 0, 0, 0
    st = StreamState()
    frames: list[bytes] = []
    used = relayed = 0
    for body in bodies:
        frame = relay_event(body, st, want_ids)
        if frame is None:
            break
        frames.append(frame)
        used = data.index(b"\r\n", used) + 4 + len(body)
        relayed += len(body)
    if not frames:
        return b"", 0, 0, 0, 0
    out = b"".join(frames)
    if chunked:
        out = b"%x\r\n%b\r\n" % (len(out), out)
    return out, st.tokens, used, relayed, len(frames)


def _native() -> tuple[RelayRead | None, str]:
    try:
        from router.serving._relay import relay_read as native
    except ImportError as exc:
        return None, f"native relay not built ({exc}): the Python relay loop is used"
    return native, ""


NATIVE, NATIVE_PROBLEM = _native()
relay_read: RelayRead = NATIVE or relay_read_py
