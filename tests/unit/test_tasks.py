"""``router.tasks.Tasks``: named background tasks, a crash logged once by name, stop cancels and awaits."""

from __future__ import annotations

import asyncio
import logging

import pytest

from router.tasks import Tasks

log = logging.getLogger("narwhal.test.tasks")


async def test_a_crash_is_logged_once_with_the_task_name_and_not_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks = Tasks(log)
    runs: list[int] = []

    async def broken() -> None:
        runs.append(1)
        raise RuntimeError("disk on fire")

    with caplog.at_level(logging.ERROR, logger=log.name):
        task = tasks.spawn(broken(), "narwhal-broken")
        with pytest.raises(RuntimeError):
            await task
        await asyncio.sleep(0)  # the done callbacks run after the awaiters are woken
    crashes = [r for r in caplog.records if r.name == log.name]
    assert [r.getMessage() for r in crashes] == ["narwhal-broken crashed: RuntimeError: disk on fire"]
    assert crashes[0].exc_info is not None  # with the traceback
    assert runs == [1] and tasks.running == 0
    await tasks.stop()  # nothing left to stop: returns


async def test_stop_cancels_every_running_task_and_returns_when_they_have_ended(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks = Tasks(log)
    started = asyncio.Event()
    cleaned: list[str] = []

    async def forever(name: str) -> None:
        try:
            started.set()
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # clean-up that itself awaits: stop waits for it
            cleaned.append(name)

    with caplog.at_level(logging.ERROR, logger=log.name):
        a = tasks.spawn(forever("a"), "narwhal-a")
        b = tasks.spawn(forever("b"), "narwhal-b")
        await started.wait()
        assert tasks.running == 2 and a.get_name() == "narwhal-a"
        await tasks.stop()
    assert a.cancelled() and b.cancelled() and sorted(cleaned) == ["a", "b"]
    assert tasks.running == 0
    assert [r for r in caplog.records if r.name == log.name] == []  # a cancel is not a crash


async def test_work_whose_caller_reports_the_outcome_is_not_logged_twice(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks = Tasks(log)

    async def refused() -> int:
        raise ValueError("refused: engine busy")

    with caplog.at_level(logging.ERROR, logger=log.name):
        task = tasks.spawn(refused(), "narwhal-mutation", crash_log=False)
        with pytest.raises(ValueError, match="engine busy"):
            await task
        await asyncio.sleep(0)
    assert [r for r in caplog.records if r.name == log.name] == []
    assert tasks.running == 0


async def test_a_finished_task_is_released_and_its_result_kept() -> None:
    tasks = Tasks(log)

    async def answer() -> int:
        return 42

    task = tasks.spawn(answer(), "narwhal-answer")
    assert await task == 42
    await asyncio.sleep(0)
    assert tasks.running == 0
