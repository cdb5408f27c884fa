"""Learn the model's context length from the engines (``/v1/models`` ``max_model_len``).

``core.model_context`` is the smallest value the engines report for the configured model (None
while none reports one); with ``serving.max_tokens_limit`` it bounds a request's ``max_tokens``
before any engine is touched (``router/serving/parse.py``). Asked at start and then every
``interval_s``; an engine that does not answer keeps its last report.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import web

from router.core import RouterCore
from router.engines.control import EngineControl
from router.tasks import Tasks

log = logging.getLogger("narwhal.context")


class ContextLimits:
    def __init__(
        self, core: RouterCore, control: EngineControl | None = None, interval_s: float = 30.0
    ) -> None:
        self.core = core
        self.interval_s = interval_s
        self._owns_control = control is None  # a shared client is started and stopped by its owner
        self.control = control or EngineControl(core.config)
        self.reported: dict[str, int] = {}
        self._tasks = Tasks(log)

    def add_routes(self, app: web.Application) -> None:
        return None

    async def start(self) -> None:
        if self._owns_control:
            await self.control.start()
        self._tasks.spawn(self._run(), "narwhal-context-limits")

    async def stop(self) -> None:
        await self._tasks.stop()
        if self._owns_control:
            await self.control.stop()

    async def refresh(self) -> bool:
        """Ask every engine once; True when all of them answered."""
        ids = self.core.config.engine_ids
        answers = await asyncio.gather(*(self.control.context_length(i) for i in ids), return_exceptions=True)
        for iid, answer in zip(ids, answers, strict=True):
            if isinstance(answer, int):
                self.reported[iid] = answer
            elif answer is None:
                self.reported.pop(iid, None)
        context = min(self.reported.values()) if self.reported else None
        if context != self.core.model_context:
            log.info("model context: %s tokens (from the engines' /v1/models)", context)
            self.core.model_context = context
        return not any(isinstance(a, BaseException) for a in answers)

    async def _run(self) -> None:
        while True:
            answered = False
            with contextlib.suppress(Exception):
                answered = await self.refresh()
            await asyncio.sleep(self.interval_s if answered else min(self.interval_s, 2.0))
