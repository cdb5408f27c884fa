"""A component's background asyncio tasks: started by name, a crash logged once, stopped together.

``Tasks.spawn`` starts a named task on the running loop and keeps a strong reference to it until it
ends (the loop holds tasks only weakly). A task that ends with an exception is logged once, at
``ERROR`` with its name and traceback (``"<name> crashed: <Class>: <message>"``), and is not
restarted: a loop that must survive a failing pass catches inside its pass (the monitor, the
context-limit poller do), so a crash here is a bug that should be seen, not retried blindly.
``stop`` cancels every task still running and awaits them all, so a component's stop returns only
when its tasks are gone. ``crash_log=False`` is for work whose outcome is awaited and reported by
its caller (a detached lifecycle mutation): its exception is the caller's, not a second log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


class Tasks:
    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self._running: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T], name: str, *, crash_log: bool = True) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        if crash_log:
            task.add_done_callback(self._log_crash)
        return task

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        """The tasks still running (a snapshot)."""
        return iter(list(self._running))

    @property
    def running(self) -> int:
        """Tasks started and not yet ended."""
        return len(self._running)

    async def stop(self) -> None:
        """Cancel every running task and wait until all have ended (their crashes already logged)."""
        tasks = list(self._running)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._running.difference_update(tasks)

    def _log_crash(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.log.error("%s crashed: %s: %s", task.get_name(), type(exc).__name__, exc, exc_info=exc)
