"""Steady client load for ``narwhal-up``: an asyncio loop of completions against the router pair.

Like a load balancer that health-checks ``GET /ready``, the load follows whichever router answers
200 (``RouterPicker``). A request that a router refuses *before answering* (connection refused, or a
503 while that router is not ready) is re-sent once to the router that is ready now — what a load
balancer does — and counted under ``retried``; everything else that is not a complete answer is a
failure with a reason — except a request that was in flight on a router when ``narwhal-up
--failover`` SIGKILLed it (sent to it before its death was confirmed, see ``router_killed``): that
one is counted under ``cut``, not ``failed``.
Requests alternate between streamed (SSE, must end with ``data: [DONE]``)
and buffered (JSON with choices).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

READY_POLL_S = 0.1


@dataclass
class LoadStats:
    served: int = 0
    failed: int = 0
    retried: int = 0
    streamed: int = 0
    buffered: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    by_router: Counter[str] = field(default_factory=Counter)
    cut: int = 0  # in flight on a router that narwhal-up killed on purpose (--failover); not in failed
    cut_reasons: Counter[str] = field(default_factory=Counter)

    def copy(self) -> LoadStats:
        return LoadStats(
            self.served, self.failed, self.retried, self.streamed, self.buffered,
            Counter(self.failures), Counter(self.by_router), self.cut, Counter(self.cut_reasons),
        )  # fmt: skip

    def minus(self, earlier: LoadStats) -> LoadStats:
        """What happened between ``earlier`` (a snapshot) and now."""
        failures = Counter(self.failures)
        failures.subtract(earlier.failures)
        by_router = Counter(self.by_router)
        by_router.subtract(earlier.by_router)
        cut_reasons = Counter(self.cut_reasons)
        cut_reasons.subtract(earlier.cut_reasons)
        return LoadStats(
            self.served - earlier.served, self.failed - earlier.failed, self.retried - earlier.retried,
            self.streamed - earlier.streamed, self.buffered - earlier.buffered,
            +failures, +by_router, self.cut - earlier.cut, +cut_reasons,
        )  # fmt: skip

    @property
    def total(self) -> int:
        return self.served + self.failed


@dataclass
class Switch:
    at: float
    router: str | None


class RouterPicker:
    """Polls ``/ready`` of every router; ``current`` is the first one that answered 200 last round."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        routers: Sequence[str],
        poll_s: float = READY_POLL_S,
        spread: bool = False,
    ) -> None:
        self.session = session
        self.routers = [r.rstrip("/") for r in routers]
        self.poll_s = poll_s
        self.current: str | None = None
        self.switches: list[Switch] = []
        self.ready_event = asyncio.Event()
        self.spread = spread  # active-active replicas: spread requests over every ready router
        self.ready: list[str] = []
        self._turn = 0

    async def _ready(self, url: str) -> bool:
        try:
            async with self.session.get(url + "/ready", timeout=aiohttp.ClientTimeout(total=1.0)) as r:
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def poll_once(self) -> str | None:
        answers = await asyncio.gather(*(self._ready(u) for u in self.routers))
        ready = [u for u, ok in zip(self.routers, answers, strict=True) if ok]
        self.ready = ready
        chosen = self.current if self.current in ready else (ready[0] if ready else None)
        if chosen != self.current:
            self.switches.append(Switch(time.time(), chosen))
            self.current = chosen
        if chosen is None:
            self.ready_event.clear()
        else:
            self.ready_event.set()
        return chosen

    async def run(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self.poll_s)

    async def wait_ready(self, within_s: float) -> str | None:
        if self.spread and self.ready:  # active-active: every ready replica in turn
            self._turn = (self._turn + 1) % len(self.ready)
            return self.ready[self._turn]
        if self.current is not None:
            return self.current
        # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation (stop() hangs)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within_s):
                await self.ready_event.wait()
        return self.current


class _Retry(Exception):
    """The router refused before answering: send the request to the ready router once more."""


def _error_reason(status: int, body: bytes) -> str:
    try:
        err = json.loads(body).get("error", {})
        kind = str(err.get("type", "")) if isinstance(err, dict) else ""
        msg = str(err.get("message", "")) if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        kind, msg = "", body[:80].decode(errors="replace")
    return f"HTTP {status} {kind}: {msg[:80]}".strip()


class LoadGenerator:
    def __init__(
        self,
        routers: Sequence[str],
        model: str,
        concurrency: int = 4,
        max_tokens: int = 16,
        think_s: float = 0.02,
        request_timeout_s: float = 60.0,
        no_router_timeout_s: float = 10.0,
        spread: bool = False,
    ) -> None:
        self.routers = list(routers)
        self.spread = spread
        self.model = model
        self.concurrency = concurrency
        self.max_tokens = max_tokens
        self.think_s = think_s
        self.request_timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self.no_router_timeout_s = no_router_timeout_s
        self.stats = LoadStats()
        self.seq = 0
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.picker: RouterPicker | None = None
        self.last_failure = ""
        # router url -> when narwhal-up saw it dead after SIGKILLing it on purpose (--failover)
        self.killed: dict[str, float] = {}

    def router_killed(self, url: str, dead_at: float | None = None) -> None:
        """``url`` is being killed on purpose: failed requests sent to it before ``dead_at`` are ``cut``.

        Call it without ``dead_at`` just before the SIGKILL (until then every request sent to it is
        in flight on a dying router), then with the time its death was confirmed.
        """
        self.killed[url.rstrip("/")] = math.inf if dead_at is None else dead_at

    def _cut_by_kill(self, router: str, sent_at: float) -> bool:
        dead_at = self.killed.get(router)
        return dead_at is not None and sent_at <= dead_at

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        self.picker = RouterPicker(self._session, self.routers, spread=self.spread)
        await self.picker.poll_once()
        self._tasks.append(asyncio.create_task(self.picker.run(), name="narwhal-up-ready-poller"))
        for i in range(self.concurrency):
            self._tasks.append(asyncio.create_task(self._worker(), name=f"narwhal-up-load-{i}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5.0)
        self._tasks.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _worker(self) -> None:
        while True:
            self.seq += 1
            stream = self.seq % 2 == 0
            ok, reason, retried, router, sent_at = await self.one(self.seq, stream)
            self.stats.retried += retried
            if ok:
                self.stats.served += 1
                self.stats.by_router[router] += 1
                if stream:
                    self.stats.streamed += 1
                else:
                    self.stats.buffered += 1
            elif self._cut_by_kill(router, sent_at):
                self.stats.cut += 1
                self.stats.cut_reasons[reason] += 1
            else:
                self.stats.failed += 1
                self.stats.failures[reason] += 1
                self.last_failure = reason
            await asyncio.sleep(self.think_s)

    async def one(self, seq: int, stream: bool) -> tuple[bool, str, int, str, float]:
        """One request (plus at most one re-send).

        Returns (ok, failure reason, re-sends, router used, when the last attempt was sent).
        """
        assert self.picker is not None
        retried = 0
        router = ""
        sent_at = time.time()
        for attempt in range(2):
            router = await self.picker.wait_ready(self.no_router_timeout_s) or ""
            sent_at = time.time()
            if not router:
                return False, f"no router ready for {self.no_router_timeout_s:.0f}s", retried, router, sent_at
            try:
                ok, reason = await self._send(router, seq, stream)
                return ok, reason, retried, router, sent_at
            except _Retry as exc:
                if attempt == 1:
                    return False, str(exc), retried, router, sent_at
                retried += 1
                await self.picker.poll_once()
        return False, "unreachable", retried, router, sent_at  # pragma: no cover - loop always returns

    async def _send(self, router: str, seq: int, stream: bool) -> tuple[bool, str]:
        assert self._session is not None
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": f"narwhal-up request {seq}: tell me about narwhals",
            "max_tokens": self.max_tokens,
            "stream": stream,
        }
        try:
            async with self._session.post(
                router + "/v1/completions", json=body, timeout=self.request_timeout
            ) as resp:
                if resp.status != 200:
                    raw = await resp.read()
                    reason = _error_reason(resp.status, raw)
                    if resp.status == 503:
                        raise _Retry(reason)
                    return False, reason
                if stream:
                    return await self._read_stream(resp)
                raw = await resp.read()
                try:
                    doc = json.loads(raw)
                except ValueError:
                    return False, "buffered answer is not JSON"
                if not isinstance(doc, dict) or not doc.get("choices"):
                    return False, "buffered answer has no choices"
                return True, ""
        except aiohttp.ClientConnectorError as exc:
            raise _Retry(f"connect: {exc.os_error or exc}") from exc
        except aiohttp.ServerDisconnectedError:
            return False, "router disconnected mid-request"
        except TimeoutError:
            return False, "client timeout"
        except aiohttp.ClientError as exc:
            return False, f"{type(exc).__name__}: {exc}"[:120]

    @staticmethod
    async def _read_stream(resp: aiohttp.ClientResponse) -> tuple[bool, str]:
        chunks = 0
        async for raw_line in resp.content:
            line = raw_line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                return (True, "") if chunks else (False, "stream ended without chunks")
            try:
                obj = json.loads(payload)
            except ValueError:
                return False, "stream chunk is not JSON"
            if isinstance(obj, dict) and "error" in obj:
                err = obj["error"]
                msg = err.get("message", "") if isinstance(err, dict) else str(err)
                return False, f"stream error: {str(msg)[:80]}"
            chunks += 1
        return False, "stream ended without [DONE]"
