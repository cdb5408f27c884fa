"""Readiness tells the truth: an engine whose ``/v1/models`` does not list the configured model
cannot serve a single request, so it is not placement-eligible (``Scheduler.excluded``).

Run by the monitor's identity stage (start-up, takeover, and for every engine that answered a
liveness sweep), for every fleet, contracted or not. The reason (``serves ['x'], expected m``) is
visible in ``/ready`` (when no engine is left), in the lifecycle document (``engines.<id>.error``)
and in ``/narwhal/state`` (``scheduler.engines.<id>.excluded``); journal events
``engine_excluded`` / ``engine_exclusion_ended``. An engine that cannot be asked (down, timeout) is
left as it is: liveness and the breaker deal with unreachable engines. Unlike the breaker, the
exclusion is not spared for a role floor: an engine serving another model serves nobody.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from router.clock import Clock
from router.scheduler import Scheduler

log = logging.getLogger("narwhal.lifecycle.models")


class ModelLister(Protocol):
    async def models(self, iid: str) -> list[str]: ...


def model_problem(served: list[str], model: str) -> str:
    return "" if model in served else f"serves {served}, expected {model}"


async def check_served_models(
    control: ModelLister,
    scheduler: Scheduler,
    model: str,
    engines: Iterable[str],
    clock: Clock,
    emit: Callable[[dict[str, Any]], None],
) -> None:
    targets = list(engines)

    async def one(iid: str) -> list[str] | None:
        try:
            return await control.models(iid)
        except Exception:
            return None  # unreadable: not a verdict about the model

    served = await asyncio.gather(*(one(i) for i in targets))
    for iid, listed in zip(targets, served, strict=True):
        if listed is None:
            continue
        problem = model_problem(listed, model)
        if problem and scheduler.excluded.get(iid) != problem:
            scheduler.excluded[iid] = problem
            log.warning("engine %s is not placement-eligible: %s", iid, problem)
            emit({"event": "engine_excluded", "at": clock.monotonic(), "iid": iid, "reason": problem})
        elif not problem and scheduler.excluded.pop(iid, None) is not None:
            log.info("engine %s lists %s again: placement-eligible", iid, model)
            emit({"event": "engine_exclusion_ended", "at": clock.monotonic(), "iid": iid})
