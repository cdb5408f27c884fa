"""HTTP/1.1 heads for the client listener's own protocol (``serving/front.py``): pure bytes work.

:func:`scan` reads the request head at the start of a connection's buffer and says one of three
things: not all there yet (``None``), a completion request the front serves itself (:class:`Head`),
or :data:`DELEGATE` — anything else, which the front hands, unread, to aiohttp: other paths and
methods, a query string, HTTP/1.0, a chunked body, ``Expect``, ``Upgrade``, a missing or repeated
``Content-Length``, and every malformed head (aiohttp answers those with its own 400). So the front
only ever serves the plain, well-formed shape of the two routes; correctness for the rest stays
aiohttp's.

:func:`response_head` builds the response head: status line, the given headers, ``Content-Length``
or ``Transfer-Encoding: chunked``, ``Date`` (formatted once a second), ``Connection: close`` when the
connection ends after it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Final, Literal, NamedTuple

from router.serving.parse import Endpoint

MAX_HEAD: Final = 8190  # aiohttp's line and field limit: a longer head is aiohttp's to refuse
TARGETS: Final[dict[bytes, Endpoint]] = {b"/v1/completions": "completions", b"/v1/chat/completions": "chat"}
_PREFIX: Final = b"POST /v1/"
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# control bytes other than HTAB, a CR not before LF, an LF not after CR (bare line ends)
_BAD = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\r(?!\n)|(?<!\r)\n")


class Head(NamedTuple):
    endpoint: Endpoint
    size: int  # bytes of the head, blank line included
    content_length: int
    keep_alive: bool
    client_rid: str | None


DELEGATE: Final = "delegate"
Scan = Head | Literal["delegate"] | None


def scan(buf: bytes | bytearray) -> Scan:
    """The request head at the start of ``buf``: a :class:`Head`, ``DELEGATE``, or None (need more)."""
    n = len(buf)
    if buf[:9] != _PREFIX[: min(n, 9)]:
        return DELEGATE
    end = buf.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
    if end < 0:
        return DELEGATE if n >= MAX_HEAD + 4 else None
    head = bytes(buf[:end])
    if _BAD.search(head):
        return DELEGATE
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[2] != b"HTTP/1.1":
        return DELEGATE
    endpoint = TARGETS.get(parts[1])
    if endpoint is None:
        return DELEGATE
    length: int | None = None
    keep_alive = True
    rid: str | None = None
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.fullmatch(name):
            return DELEGATE  # no colon, an empty or bad name, whitespace before the colon, obs-fold
        name = name.lower()
        value = value.strip(b" \t")
        if name == b"content-length":
            if length is not None or not value.isdigit():
                return DELEGATE
            length = int(value)
        elif name == b"x-request-id":
            if rid is None:
                rid = value.decode("latin-1")
        elif name == b"connection":
            tokens = {t.strip() for t in value.lower().split(b",")}
            if b"upgrade" in tokens:
                return DELEGATE
            if b"close" in tokens:
                keep_alive = False
        elif name in (b"transfer-encoding", b"expect", b"upgrade"):
            return DELEGATE
    if length is None:
        return DELEGATE
    return Head(endpoint, end + 4, length, keep_alive, rid)


_STATUS_LINES: dict[int, bytes] = {}
_date_second = 0
_date_line = b""


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = "Client Closed Request" if status == 499 else "Unknown"
        line = _STATUS_LINES[status] = b"HTTP/1.1 %d %s\r\n" % (status, reason.encode("latin-1"))
    return line


def date_line() -> bytes:
    """``Date: …\\r\\n`` (RFC 9110 IMF-fixdate), formatted at most once a second."""
    global _date_second, _date_line
    now = int(time.time())
    if now != _date_second:
        _date_second = now
        _date_line = b"date: " + formatdate(now, usegmt=True).encode("ascii") + b"\r\n"
    return _date_line


def response_head(
    status: int, headers: Mapping[str, str], content_length: int | None, keep_alive: bool
) -> bytes:
    """The response head; ``content_length=None`` means a chunked body."""
    out = [_status_line(status)]
    for name, value in headers.items():
        out.append(b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1")))
    if content_length is None:
        out.append(b"transfer-encoding: chunked\r\n")
    else:
        out.append(b"content-length: %d\r\n" % content_length)
    out.append(date_line())
    if not keep_alive:
        out.append(b"connection: close\r\n")
    out.append(b"\r\n")
    return b"".join(out)
