"""Keep an activity visibly alive while it awaits one long call (a drain, a readmission's
validation, a supervisor restart), so a killed worker is detected after ``heartbeat_timeout``
instead of ``start_to_close_timeout``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from temporalio import activity

T = TypeVar("T")


async def heartbeating(aw: Awaitable[T], every_s: float = 1.0) -> T:
    task = asyncio.ensure_future(aw)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=every_s)
            if done:
                return task.result()
            activity.heartbeat()
    finally:
        if not task.done():
            task.cancel()
