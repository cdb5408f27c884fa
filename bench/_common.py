"""Shared benchmark parts: a closed-loop streaming load generator (latency and TTFT percentiles),
CPU pinning and per-process CPU accounting, and report formatting (markdown tables, median ± spread).

Everything targets 127.0.0.1 only; every process is started through ``narwhal_testing.procs`` and
stopped by its PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# the streamed-completion client lives in the package (the chaos drill uses it too); re-exported here
from fleet.chaos.streams import (  # noqa: E402, F401
    JSON_HEADERS,
    MODEL,
    RequestFailed,
    completion_body,
    new_session,
    pct,
    stream_completion,
)

SHORT_PROMPT = "the quick brown narwhal jumps over the lazy walrus"
# ~4100 simulator tokens: with --ttft-per-token-ms 0.05 the prefill leg costs ~+200 ms
LONG_PROMPT = " ".join(f"narwhal{i % 97} tusk{i % 31}" for i in range(1000))
# 8,000 characters exactly (the issue-26 row; LONG_PROMPT is 2,000 words, 16,561 characters)
PROMPT_8K = LONG_PROMPT[:8000]
# 2,000 characters exactly (the issue-26 "2,000-character" row)
PROMPT_2K = LONG_PROMPT[:2000]

# -- CPU pinning -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pinning:
    """Which CPUs the load generator and the servers (routers + engines) run on."""

    loadgen: frozenset[int]
    servers: frozenset[int]

    @classmethod
    def default(cls) -> Pinning:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            return cls(frozenset(cpus), frozenset(cpus))
        return cls(frozenset({cpus[0]}), frozenset(cpus[1:]))

    def describe(self) -> str:
        return f"load generator on CPU {_cpus(self.loadgen)}, routers + engines on CPU {_cpus(self.servers)}"

    def server_cmd(self, cmd: Sequence[str]) -> list[str]:
        """``taskset -c <servers> cmd...`` (taskset execs, so the PID is the server's own)."""
        return ["taskset", "-c", _cpus(self.servers), *cmd]

    def pin_self(self) -> None:
        os.sched_setaffinity(0, self.loadgen)


def _cpus(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


# -- per-process CPU -------------------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads) in seconds, from /proc/<pid>/stat."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state); utime/stime are fields 14/15
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_sys_cpu_s(pid: int) -> float:
    """stime of ``pid`` (all its threads): the kernel's share of ``proc_cpu_s``."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    return int(raw[raw.rindex(")") + 2 :].split()[12]) / CLK_TCK


def proc_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -- load generator --------------------------------------------------------------------------------


@dataclass(slots=True)
class Sample:
    start: float  # perf_counter at send
    end: float
    ttft: float  # seconds to the first streamed token frame (0 when none arrived)
    ok: bool
    error: str = ""
    target: str = ""  # which URL answered (router / prefill+decode pair)
    frames: int = 0  # token frames received (streamed requests)


async def direct_pd_completion(
    session: aiohttp.ClientSession, prefill: str, decode: str, body: dict[str, Any]
) -> tuple[float, int]:
    """The floor: the client runs the vLLM/NIXL PD split itself (prefill with ``do_remote_decode``,
    then a streamed decode with the producer's descriptor). TTFT counts from the prefill send."""
    t0 = time.perf_counter()
    pre = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
    try:
        async with session.post(
            prefill + "/v1/completions", data=orjson.dumps(pre), headers=JSON_HEADERS
        ) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise RequestFailed(f"http_{resp.status}", raw[:300].decode(errors="replace"))
    except aiohttp.ClientError as exc:
        raise RequestFailed("connect", repr(exc)) from None
    doc = orjson.loads(raw)
    desc = doc.get("kv_transfer_params") or doc["choices"][0].get("kv_transfer_params")
    if not desc:
        raise RequestFailed("no_descriptor")
    dec = {**body, "stream": True, "kv_transfer_params": desc}
    return await stream_completion(session, decode, dec, t0=t0)


def router_sender(url: str, body: dict[str, Any]) -> Callable[[aiohttp.ClientSession, int], Any]:
    def send(session: aiohttp.ClientSession, _i: int) -> Any:
        return stream_completion(session, url, body)

    return send


def direct_pd_sender(
    prefills: Sequence[str], decodes: Sequence[str], body: dict[str, Any]
) -> Callable[[aiohttp.ClientSession, int], Any]:
    """Round-robin over prefill and decode engines independently (what the routers' round robin does)."""

    def send(session: aiohttp.ClientSession, i: int) -> Any:
        return direct_pd_completion(
            session, prefills[i % len(prefills)], decodes[(i // len(prefills)) % len(decodes)], body
        )

    return send


@dataclass
class LoadResult:
    concurrency: int
    wall_s: float
    samples: list[Sample] = field(default_factory=list)
    loadgen_cpu_s: float = 0.0

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.ok]

    @property
    def errors(self) -> Counter[str]:
        return Counter(s.error for s in self.samples if not s.ok)

    def summary(self) -> dict[str, float]:
        ok = self.ok
        lat = [s.end - s.start for s in ok]
        ttft = [s.ttft for s in ok if s.ttft]
        return {
            "requests": float(len(ok)),
            "frames": float(sum(s.frames for s in ok)),
            "errors": float(len(self.samples) - len(ok)),
            "rps": len(ok) / self.wall_s if self.wall_s else 0.0,
            "p50_ms": pct(lat, 50) * 1e3,
            "p99_ms": pct(lat, 99) * 1e3,
            "ttft_p50_ms": pct(ttft, 50) * 1e3,
            "ttft_p99_ms": pct(ttft, 99) * 1e3,
            "loadgen_cpu_util": self.loadgen_cpu_s / self.wall_s if self.wall_s else 0.0,
        }


async def closed_loop(
    send: Callable[[aiohttp.ClientSession, int], Any],
    concurrency: int,
    duration_s: float,
    warmup_s: float = 0.5,
    max_requests: int | None = None,
    on_measure: Callable[[], None] | None = None,
) -> LoadResult:
    """``concurrency`` workers, each sending its next request as soon as the last one ended.

    The first ``warmup_s`` seconds are not measured (connections, caches); then requests *started*
    within ``duration_s`` are recorded (bounded by ``max_requests`` when given). Wall time runs
    from the measurement start to the end of the last recorded request. ``on_measure`` is called
    once the warm-up requests have all finished, right before measurement starts.
    """
    counter = itertools.count()
    async with new_session(concurrency) as session:
        warm_until = time.perf_counter() + warmup_s

        async def warm() -> None:
            while time.perf_counter() < warm_until:
                with contextlib.suppress(RequestFailed):
                    await send(session, next(counter))

        await asyncio.gather(*(warm() for _ in range(concurrency)))
        result = LoadResult(concurrency=concurrency, wall_s=0.0)
        if on_measure is not None:
            on_measure()
        t_start = time.perf_counter()
        cpu0 = time.process_time()
        stop_at = t_start + duration_s
        issued = 0

        async def worker() -> None:
            nonlocal issued
            while time.perf_counter() < stop_at and (max_requests is None or issued < max_requests):
                issued += 1
                i = next(counter)
                t0 = time.perf_counter()
                try:
                    ttft, frames = await send(session, i)
                    result.samples.append(Sample(t0, time.perf_counter(), ttft, True, frames=frames))
                except RequestFailed as exc:
                    result.samples.append(Sample(t0, time.perf_counter(), 0.0, False, exc.kind))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.wall_s = time.perf_counter() - t_start
        result.loadgen_cpu_s = time.process_time() - cpu0
    return result


# -- statistics across repetitions -----------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    median: float
    lo: float
    hi: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            return cls(0.0, 0.0, 0.0)
        return cls(statistics.median(values), min(values), max(values))

    def fmt(self, digits: int = 1) -> str:
        return f"{self.median:.{digits}f} ({self.lo:.{digits}f}–{self.hi:.{digits}f})"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def run_async(coro: Any) -> Any:
    """Run ``coro`` on uvloop when available (the load generator's loop)."""
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)
