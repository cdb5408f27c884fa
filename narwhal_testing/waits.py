"""Waiting on a state or an event in tests and drills: poll a check until it holds, with a bound.

The bound is a hang guard, not a speed assertion: tests wait on what they can observe (a status,
a log line, a file), never on a guessed duration.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(what: str, check: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05) -> Any:
    """Call ``check`` until it returns something truthy and return that; ``AssertionError`` naming
    ``what`` and the last value when ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")
