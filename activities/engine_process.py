"""The worker's one read of an engine: its live process start (``process_start_time_seconds`` on
``/metrics``, through router/engines/identity.py's parser).

Shared by the preflight (does every engine to restart answer at its address?) and the restart
backends (which process runs there now?), over the caller's httpx client.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from router.engines.identity import process_start_or_none

READ_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class ProcessStartRead:
    start: float | None  # None: not read; ``problem`` says why
    problem: str = ""  # operator-facing, e.g. "answered HTTP 503 on /metrics"


async def read_process_start(http: httpx.AsyncClient, url: str) -> ProcessStartRead:
    try:
        r = await http.get(f"{url}/metrics", timeout=READ_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return ProcessStartRead(None, f"does not answer from the worker ({type(exc).__name__})")
    if r.status_code != 200:
        return ProcessStartRead(None, f"answered HTTP {r.status_code} on /metrics")
    start = process_start_or_none(r.text)
    if start is None:
        return ProcessStartRead(None, "reports no process_start_time_seconds on /metrics")
    return ProcessStartRead(start)
