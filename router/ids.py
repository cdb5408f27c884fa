"""Engine ids and engine URLs as every entry point accepts them (fleet file, ``/narwhal/targets``,
a supervisor's engine list, workflow input).

An engine id reaches restart commands, workflow ids, file names and metric labels, so it is held to
``[A-Za-z0-9._-]{1,64}`` (the peer's ``e0``, ``p1``, ``vllm-decode.3`` all pass). An engine URL is
parsed: ``http``/``https``, a host name or IP literal, an optional port and a plain path — no
credentials, query, fragment, spaces or shell metacharacters. Refusals are ``UnsafeValue`` with a
message that names the value (``repr``) and where it came from.

Stdlib only: workflow modules, the router's config and the worker's activities all import it.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator

ENGINE_ID_PATTERN = r"[A-Za-z0-9._-]{1,64}"
_ENGINE_ID = re.compile(ENGINE_ID_PATTERN)
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}))*\.?")
_PATH = re.compile(r"[A-Za-z0-9._~/%-]*")


class UnsafeValue(ValueError):
    """An engine id or URL refused at an entry point (the message names it)."""


def check_engine_id(value: object, where: str = "engine id") -> str:
    if not isinstance(value, str) or not _ENGINE_ID.fullmatch(value):
        raise UnsafeValue(f"{where} {value!r} refused: an engine id must match {ENGINE_ID_PATTERN}")
    return value


def check_engine_url(value: object, where: str = "engine URL") -> str:
    """The URL without a trailing slash; refused unless it is a plain http(s) base URL."""
    if not isinstance(value, str) or not value:
        raise UnsafeValue(f"{where} {value!r} refused: not a URL")
    why = _url_problem(value)
    if why:
        raise UnsafeValue(f"{where} {value!r} refused: {why}")
    return value.rstrip("/")


def _url_problem(value: str) -> str:
    if any(c.isspace() or ord(c) < 0x20 for c in value):
        return "whitespace or control characters"
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        return f"not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "the scheme must be http or https"
    if "@" in parts.netloc:
        return "credentials in the URL"
    host = parts.hostname or ""
    if not host:
        return "no host"
    if parts.netloc.startswith("["):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return f"bad IPv6 literal {host!r}"
    elif not _HOST.fullmatch(host):
        return f"bad host name {host!r}"
    if port is not None and not 0 < port < 65536:
        return f"bad port {port}"
    if parts.query or parts.fragment or "?" in value or "#" in value:
        return "a query or fragment"
    if not _PATH.fullmatch(parts.path):
        return f"unsafe characters in the path {parts.path!r}"
    return ""


def _id(value: str) -> str:
    return check_engine_id(value)


def _url(value: str) -> str:
    return check_engine_url(value)


# pydantic field types: ``iid: EngineId`` / ``url: EngineUrl`` (a ValidationError names the value)
EngineId = Annotated[str, AfterValidator(_id)]
EngineUrl = Annotated[str, AfterValidator(_url)]
