"""Operational routes: ``GET /health``, ``/ready``, ``/metrics``, ``/v1/models`` (spec §1, §3.5, §11.2)."""

from __future__ import annotations

import orjson
from aiohttp import web

from router.core import RouterCore
from router.metrics import CONTENT_TYPE, MetricsRenderer

_JSON = "application/json"


def _lease_problem(core: RouterCore) -> str:
    lease = core.control.lease
    return (lease.problem or lease.recovered) if lease is not None else ""


class Ops:
    def __init__(self, core: RouterCore, metrics: MetricsRenderer) -> None:
        self.core = core
        self.metrics = metrics
        self._models = orjson.dumps(
            {"object": "list", "data": [{"id": core.config.model, "object": "model", "owned_by": "narwhal"}]}
        )

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/health", self.health)
        app.router.add_get("/ready", self.ready)
        app.router.add_get("/metrics", self.metrics_route)
        app.router.add_get("/v1/models", self.models)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def health(self, _: web.Request) -> web.Response:
        sched = self.core.scheduler
        doc = {
            "status": self.core.health_status(),
            "instances": len(sched.engines),
            "available_instances": len(sched.eligible()),
        }
        return web.Response(body=orjson.dumps(doc), content_type=_JSON)

    async def ready(self, _: web.Request) -> web.Response:
        core = self.core
        ready = core.ready()
        doc = {
            "status": "ready" if ready else "not_ready",
            "control_ready": core.control_ready(),
            "epoch": core.control.epoch,
            "holder": core.control.holder,
            "reason": "" if ready else core.ready_reason(),
            # the control plane cannot persist state: lifecycle changes are refused (serving goes on)
            "control_degraded": core.persist_degraded,
            # damage found in the lease record now, else what the last recovery of it did
            "lease_problem": _lease_problem(core),
        }
        journal = core.journal.degraded()
        if journal:  # present only while journal rows are not being written; serving goes on
            doc["journal_degraded"] = journal
        headers = None if ready else {"retry-after": "1"}
        return web.Response(
            status=200 if ready else 503, body=orjson.dumps(doc), content_type=_JSON, headers=headers
        )

    async def metrics_route(self, _: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render().encode(), headers={"content-type": CONTENT_TYPE})

    async def models(self, _: web.Request) -> web.Response:
        return web.Response(body=self._models, content_type=_JSON)
