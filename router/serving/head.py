"""HTTP/1.1 heads for the client listener's own protocol (``serving/front.py``): pure bytes work.

:func:`scan` reads the request head at the start of a connection's buffer (parsed by httptools)
and says one of three things: not all there yet (``None``), a completion request the front serves itself (:class:`Head`),
or :data:`DELEGATE` — anything else, which the front hands, unread, to aiohttp: other paths and
methods, a query string, HTTP/1.0, a chunked body, ``Expect``, ``Upgrade``, a missing or repeated
``Content-Length``, and every malformed head, also one not complete yet that has a line ended by a
bare LF (aiohttp answers those with its own 400 at once). So the front
only ever serves the plain, well-formed shape of the two routes; correctness for the rest stays
aiohttp's.

:func:`response_head` builds the response head: status line, the given headers, ``Content-Length``
or ``Transfer-Encoding: chunked``, ``Date`` (formatted once a second), ``Connection: close`` when the
connection ends after it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Final, Literal, NamedTuple

import httptools

from router.serving.parse import Endpoint

MAX_HEAD: Final = 8190  # aiohttp's line and field limit: a longer head is aiohttp's to refuse
TARGETS: Final[dict[bytes, Endpoint]] = {b"/v1/completions": "completions", b"/v1/chat/completions": "chat"}
_PREFIX: Final = b"POST /v1/"
_REFUSED: Final = frozenset({b"transfer-encoding", b"expect", b"upgrade"})


class Head(NamedTuple):
    endpoint: Endpoint
    size: int  # bytes of the head, blank line included
    content_length: int
    keep_alive: bool
    client_rid: str | None


DELEGATE: Final = "delegate"
Scan = Head | Literal["delegate"] | None


class _Fields:
    """httptools callbacks for one head: what the front needs, and whether it must delegate."""

    __slots__ = ("delegate", "length", "rid", "url")

    def __init__(self) -> None:
        self.url = b""
        self.length: int | None = None
        self.rid: str | None = None
        self.delegate = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length":
            self.length = int(value)  # llhttp checked it: digits, one value
        elif name == b"x-request-id":
            if self.rid is None:
                self.rid = value.decode("latin-1")
        elif name in _REFUSED:
            self.delegate = True


def scan(buf: bytes | bytearray) -> Scan:
    """The request head at the start of ``buf``: a :class:`Head`, ``DELEGATE``, or None (need more).

    The head is parsed by httptools (llhttp, strict): whatever it refuses, aiohttp refuses too."""
    n = len(buf)
    if buf[:9] != _PREFIX[: min(n, 9)]:
        return DELEGATE
    end = buf.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
    if end < 0:
        if n >= MAX_HEAD + 4 or buf.count(b"\n", 0, n) != buf.count(b"\r\n", 0, n):
            return DELEGATE  # too long, or a bare LF: no head will come; aiohttp answers 400
        return None
    fields = _Fields()
    parser = httptools.HttpRequestParser(fields)
    try:
        parser.feed_data(bytes(buf[: end + 4]))
    except (httptools.HttpParserError, httptools.HttpParserUpgrade):  # malformed, or an upgrade: aiohttp
        return DELEGATE
    if (
        fields.delegate
        or fields.length is None
        or parser.get_http_version() != "1.1"
        or parser.get_method() != b"POST"
    ):
        return DELEGATE
    endpoint = TARGETS.get(fields.url)
    if endpoint is None:
        return DELEGATE
    return Head(endpoint, end + 4, fields.length, parser.should_keep_alive(), fields.rid)


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
