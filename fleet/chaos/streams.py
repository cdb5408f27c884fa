"""Streamed completions as a client sees them, for the benches and the chaos drill: one request
(``stream_completion``, failures as ``RequestFailed`` with a short kind), a pooled aiohttp session,
nearest-rank percentiles. Loopback targets only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import orjson

MODEL = "sim-model"
JSON_HEADERS = {"Content-Type": "application/json"}


class RequestFailed(Exception):
    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind
        self.detail = detail


def completion_body(prompt: str, max_tokens: int, stream: bool = True) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}


async def stream_completion(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], t0: float | None = None
) -> tuple[float, int]:
    """POST a streamed completion; returns (seconds from ``t0`` to the first token frame, frames).

    Raises ``RequestFailed`` with a short kind: ``http_<status>``, ``connect``, ``stream_cut``
    (the body ended without ``[DONE]``), ``stream_error`` (an error frame), ``timeout``.
    """
    t0 = time.perf_counter() if t0 is None else t0
    ttft = 0.0
    frames = 0
    got_bytes = False
    try:
        async with session.post(
            url + "/v1/completions", data=orjson.dumps(body), headers=JSON_HEADERS
        ) as resp:
            if resp.status != 200:
                text = (await resp.read())[:300].decode(errors="replace")
                raise RequestFailed(f"http_{resp.status}", text)
            async for line in resp.content:
                got_bytes = True
                if not line.startswith(b"data: "):
                    continue
                if line.startswith(b"data: [DONE]"):
                    return ttft, frames
                if b'"error"' in line[:40]:
                    raise RequestFailed("stream_error", line[:300].decode(errors="replace"))
                frames += 1
                if not ttft:
                    ttft = time.perf_counter() - t0
    except aiohttp.ClientConnectorError as exc:
        raise RequestFailed("connect", str(exc)) from None
    except (
        aiohttp.ClientPayloadError,
        aiohttp.ServerDisconnectedError,
        aiohttp.ClientOSError,
        ConnectionResetError,
    ) as exc:
        raise RequestFailed("stream_cut" if got_bytes else "disconnect", repr(exc)) from None
    except TimeoutError:
        raise RequestFailed("timeout") from None
    except aiohttp.ClientError as exc:
        raise RequestFailed("client_error", repr(exc)) from None
    raise RequestFailed("stream_cut", "no [DONE]")


def pct(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]


def new_session(concurrency: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=max(16, concurrency * 2), limit_per_host=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=120, sock_connect=5)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)
