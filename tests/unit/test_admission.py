"""Admission seats + FIFO queue: refusal when full, arrival order, seats handed over, never leaked."""

from __future__ import annotations

import asyncio

import pytest

from router.metrics import ServingStats
from router.serving.admission import Admission, QueueExpired, QueueFull


def test_full_queue_refuses_and_seats_go_to_the_oldest_waiter() -> None:
    async def run() -> None:
        stats = ServingStats()
        adm = Admission(stats, seats=1, capacity=2, timeout_s=0, deadline_s=60)
        assert adm.try_enter() and not adm.try_enter()
        order: list[str] = []

        async def wait(name: str) -> None:
            await adm.enter()
            order.append(name)

        a = asyncio.create_task(wait("a"))
        await asyncio.sleep(0)
        b = asyncio.create_task(wait("b"))
        await asyncio.sleep(0)
        assert stats.queued == 2 and stats.inflight == 1
        with pytest.raises(QueueFull):
            await adm.enter()
        adm.leave()  # the seat goes to a, not to a newcomer
        assert not adm.try_enter()
        await a
        assert order == ["a"] and stats.inflight == 1 and stats.queued == 1
        adm.leave()
        await b
        adm.leave()
        assert order == ["a", "b"] and stats.inflight == 0 and stats.queued == 0

    asyncio.run(run())


def test_no_queue_refuses_at_once() -> None:
    async def run() -> None:
        adm = Admission(ServingStats(), seats=1, capacity=0, timeout_s=0, deadline_s=60)
        assert adm.try_enter()
        with pytest.raises(QueueFull):
            await adm.enter()

    asyncio.run(run())


def test_cancelled_or_expired_waiters_never_keep_a_seat() -> None:
    async def run() -> None:
        stats = ServingStats()
        adm = Admission(stats, seats=1, capacity=3, timeout_s=0.01, deadline_s=60)
        assert adm.try_enter()
        with pytest.raises(QueueExpired):
            await adm.enter()
        gone = asyncio.create_task(adm.enter())
        await asyncio.sleep(0)
        stays = asyncio.create_task(adm.enter())
        await asyncio.sleep(0)
        adm.leave()  # handed to ``gone``, which is cancelled before it runs: passed on to ``stays``
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        await stays
        assert stats.inflight == 1 and stats.queued == 0
        adm.leave()
        assert stats.inflight == 0 and adm.try_enter()

    asyncio.run(run())
