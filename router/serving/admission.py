"""Admission (spec §11.1): in-flight seats plus an optional FIFO queue in front of them.

A request takes a seat when one is free and nobody is queued; otherwise it queues while the queue
has room (``serving.queue_capacity``), else it is refused (429 ``inflight_limit``). A queued request
waits at most ``serving.queue_timeout_s`` and then expires (504 ``queue_expired``, reason
``queue_timeout``); with ``queue_timeout_s`` 0 the request's own deadline (``request_timeout_s``)
bounds the wait instead (504 ``request_expired``, reason ``deadline``). A seat given back goes straight to the oldest waiter, so the queue
is served in arrival order and the number of seats in use never exceeds the limit.
"""

from __future__ import annotations

import asyncio
from collections import deque

from router.metrics import ServingStats


class QueueFull(Exception):
    """No free seat and no room in the queue."""


class QueueExpired(Exception):
    """Waited ``queue_timeout_s`` in the queue without getting a seat."""


class Admission:
    __slots__ = ("capacity", "queue_timeout", "seats", "stats", "timeout", "waiters")

    def __init__(
        self, stats: ServingStats, seats: int, capacity: int, timeout_s: float, deadline_s: float
    ) -> None:
        self.stats = stats  # ``stats.inflight`` = seats in use (exported as narwhal_inflight_requests)
        self.seats = seats
        self.capacity = capacity
        self.queue_timeout = timeout_s > 0  # False: the wait is bounded by the request deadline
        self.timeout = timeout_s if timeout_s > 0 else deadline_s
        self.waiters: deque[asyncio.Future[None]] = deque()

    def try_enter(self) -> bool:
        """Take a free seat now (the hot path: no allocation, no await)."""
        if self.stats.inflight < self.seats and not self.waiters:
            self.stats.inflight += 1
            return True
        return False

    async def enter(self) -> float:
        """Wait in the queue for a seat; returns the seconds waited. Raises QueueFull / QueueExpired."""
        if self.stats.queued >= self.capacity:
            raise QueueFull
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        fut: asyncio.Future[None] = loop.create_future()
        self.waiters.append(fut)
        self.stats.queued += 1
        try:
            async with asyncio.timeout(self.timeout):
                await fut
        except TimeoutError:
            self._give_up(fut)
            raise QueueExpired from None
        except BaseException:
            self._give_up(fut)
            raise
        finally:
            self.stats.queued -= 1
        return loop.time() - t0

    def _give_up(self, fut: asyncio.Future[None]) -> None:
        if fut.done() and not fut.cancelled():
            self.leave()  # a seat was handed to us as we gave up: pass it on
        else:
            fut.cancel()
            try:
                self.waiters.remove(fut)
            except ValueError:
                pass

    def leave(self) -> None:
        """Give a seat back: to the oldest waiter if there is one, else free it."""
        waiters = self.waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the seat changes hands; stats.inflight is unchanged
                return
        self.stats.inflight -= 1
