"""Builds the aiohttp Application from components: routes and wiring only, no logic.

A component contributes routes and start/stop hooks. ``router/assemble.py`` decides which
components a router process runs (serving, ops, lifecycle, HA) and in what order they start.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from aiohttp import web

from router.core import RouterCore

CORE_KEY: web.AppKey[RouterCore] = web.AppKey("narwhal_core", RouterCore)


class Component(Protocol):
    def add_routes(self, app: web.Application) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def build_app(core: RouterCore, components: Sequence[Component], client_max_size: int) -> web.Application:
    app = web.Application(client_max_size=client_max_size)
    app[CORE_KEY] = core
    for component in components:
        component.add_routes(app)

    async def _startup(_: web.Application) -> None:
        await core.journal.start()  # provenance hashing and git describe off the loop
        for component in components:
            await component.start()

    async def _cleanup(_: web.Application) -> None:
        for component in reversed(components):
            await component.stop()
        core.journal.close()

    app.on_startup.append(_startup)
    app.on_cleanup.append(_cleanup)
    return app
