"""The canary analysis's sample activity: every router's per-engine serving evidence, as counters.

``sample_evidence`` reads ``GET /narwhal/state`` (its ``engine_evidence`` section and ``run``) from
every configured router — each router, and each active-active replica, counts the legs it placed
itself, so the analysis sums them (workflows/analysis.py) — and returns the cumulative counters.
The workflow differences two samples over its window; nothing here judges. A router that does not
answer is named in ``unreachable``; when none answers the activity fails (retryable).
"""

from __future__ import annotations

import time
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError
from temporalio import activity

from activities import errors
from activities.router import LifecycleClient
from narwhal_models.evidence import Buckets, EngineCounters, EvidenceSnapshot, LegCounters, RouterEvidence
from narwhal_models.restart import RouterRef


class _Hist(BaseModel):
    model_config = ConfigDict(extra="ignore")
    bounds: list[float]
    counts: list[int]


class _Leg(BaseModel):
    model_config = ConfigDict(extra="ignore")
    served: int
    failed: dict[str, int]
    ttft_s: _Hist
    tpot_s: _Hist | None = None


class _Engine(BaseModel):
    model_config = ConfigDict(extra="ignore")
    prefill: _Leg
    decode: _Leg


class _StateEvidence(BaseModel):
    """The part of ``narwhal.state`` v1 the analysis reads (``engine_evidence`` is additive)."""

    model_config = ConfigDict(extra="ignore")
    run: str
    engine_evidence: dict[str, _Engine]


def _buckets(h: _Hist | None) -> Buckets | None:
    return None if h is None else Buckets(bounds=h.bounds, counts=h.counts)


def _leg(leg: _Leg) -> LegCounters:
    return LegCounters(
        served=leg.served, failed=dict(leg.failed), ttft=_buckets(leg.ttft_s), tpot=_buckets(leg.tpot_s)
    )


def router_evidence(doc: Any) -> RouterEvidence:
    """``narwhal.state`` v1 → the counters; a document without ``engine_evidence`` raises
    ``ValueError`` naming what is missing (a router too old for canary analysis)."""
    try:
        st = _StateEvidence.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"/narwhal/state: {where}: {first['msg']}") from None
    return RouterEvidence(
        run=st.run,
        engines={
            iid: EngineCounters(prefill=_leg(e.prefill), decode=_leg(e.decode))
            for iid, e in st.engine_evidence.items()
        },
    )


class EvidenceActivities:
    def __init__(self, client: LifecycleClient) -> None:
        self.client = client

    @activity.defn(name="sample_evidence")
    async def sample_evidence(self, ref: RouterRef) -> EvidenceSnapshot:
        snap = EvidenceSnapshot(at=time.time())
        router = self.client.resolve(ref)  # the worker's configured router: its URLs, its token
        for url in router.urls:
            try:
                status, body = await self.client._request(
                    router, "GET", f"{url}/narwhal/state", wait_s=ref.request_timeout_s
                )
            except httpx.HTTPError as exc:
                snap.unreachable[url] = type(exc).__name__
                continue
            if status != 200:
                snap.unreachable[url] = f"HTTP {status}"
                continue
            try:
                snap.routers[url] = router_evidence(body)
            except ValueError as exc:
                snap.unreachable[url] = str(exc)
        if not snap.routers:
            raise errors.router_unavailable(
                "no router answered with its serving evidence ("
                + "; ".join(f"{u}: {why}" for u, why in snap.unreachable.items())
                + ")"
            )
        return snap
