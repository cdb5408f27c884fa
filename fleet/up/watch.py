"""Observers of a running stack: router-pair control (takeovers) and restart-workflow progress."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx

from fleet.up.summary import Takeover
from router.tasks import Tasks

log = logging.getLogger("narwhal.up")

RPC_TIMEOUT = timedelta(seconds=5)


@dataclass
class RouterView:
    status: int = 0
    control_ready: bool = False
    epoch: int = 0
    holder: str = ""
    reason: str = ""


@dataclass
class HAWatcher:
    """Polls ``GET /ready`` of each router; a router gaining control under a higher epoch = takeover."""

    routers: dict[str, str]  # name -> url
    interval_s: float = 0.25
    views: dict[str, RouterView] = field(default_factory=dict)
    controller: str = ""
    epoch: int | None = None
    takeovers: list[Takeover] = field(default_factory=list)
    on_takeover: Callable[[Takeover], None] | None = None
    _tasks: Tasks = field(default_factory=lambda: Tasks(log), init=False, repr=False)

    async def poll_once(self, http: httpx.AsyncClient) -> None:
        for name, url in self.routers.items():
            view = RouterView()
            try:
                r = await http.get(url + "/ready", timeout=1.0)
                doc: dict[str, Any] = (
                    r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
                )
                view = RouterView(
                    r.status_code, bool(doc.get("control_ready")), int(doc.get("epoch") or 0),
                    str(doc.get("holder") or ""), str(doc.get("reason") or ""),
                )  # fmt: skip
            except (httpx.HTTPError, ValueError):
                pass
            self.views[name] = view
            if not view.control_ready:
                continue
            if self.epoch is None:
                self.epoch, self.controller = view.epoch, name  # the initial claim, not a takeover
            elif view.epoch > self.epoch:
                t = Takeover(time.time(), name, self.epoch, view.epoch, view.holder)
                self.takeovers.append(t)
                self.epoch, self.controller = view.epoch, name
                if self.on_takeover is not None:
                    self.on_takeover(t)

    async def run(self) -> None:
        async with httpx.AsyncClient() as http:
            while True:
                await self.poll_once(http)
                await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._tasks.spawn(self.run(), "narwhal-up-ha-watcher")

    async def stop(self) -> None:
        await self._tasks.stop()


def progress_lines(progress: Any, shown: dict[str, str]) -> list[str]:
    """New lines for a ``RestartProgress``: the run state and each engine whose step changed."""
    out: list[str] = []
    head = f"{progress.state}: {progress.message}"
    if shown.get("") != head:
        shown[""] = head
        out.append(head)
    for e in progress.engines.values():
        detail = e.error or e.note
        wait = f" [waiting for operator: {e.waiting_for}]" if e.waiting_for else ""
        line = (
            f"  {e.iid:<5} {e.step:<24} router={e.router_state or '-'}"
            + (f"  {detail}" if detail else "")
            + wait
        )
        if shown.get(e.iid) != line:
            shown[e.iid] = line
            out.append(line)
    return out


def failover_trigger(progress: Any, after: int = 2) -> str:
    """When ``--failover`` should kill the primary: once the ``after``-th engine's step has begun.

    Returns what happened (e.g. ``"e1 began draining"``), or "" while fewer engines have begun.
    """
    begun = [e for e in progress.engines.values() if e.step != "pending"]
    if len(begun) < after:
        return ""
    last = max(begun, key=lambda e: e.started_at or 0.0)
    return f"{last.iid} began {last.step} (engine {len(begun)} of {len(progress.engines)})"
