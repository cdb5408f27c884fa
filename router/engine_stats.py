"""Per-engine serving evidence: what each configured engine did with the legs it was given.

For every configured engine and leg (``prefill``, ``decode``): legs served, legs failed by reason
(``LegFailure.reason``: ``engine_error``, ``engine_timeout``, …), time to first token (the prefill
leg's latency; the decode leg's first chunk after it was opened) and, on the decode leg, time per
output token. Everything is cumulative — counters and bucketed histograms a reader differences over
a window (the restart workflows' canary analysis does, ``workflows/analysis.py``).

Pure: serving calls the three ``record`` methods with durations it measured on the injected clock;
nothing here reads a clock or a socket. Cardinality is bounded: only the engines of the fleet file
are tracked; a leg on any other id is ignored. ``/metrics`` shows it with label ``engine``
(``families``), ``/narwhal/state`` as ``engine_evidence`` (``snapshot``). Each router (each
active-active replica) reports the legs it placed itself.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from pydantic import BaseModel, ConfigDict, Field

LEGS: tuple[str, str] = ("prefill", "decode")
# fine steps (about ×1.25-1.5 apart): a ratio of two percentiles read from these buckets (the
# canary analysis, workflows/analysis.py) is good to about that factor
TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
    0.15, 0.2, 0.25, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
TPOT_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05,
    0.075, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HistogramView(_Doc):
    """A cumulative latency histogram: ``counts[i]`` observations ≤ ``bounds[i]`` and above the
    bound before it; the last count (one more than ``bounds``) is above the last bound."""

    bounds: list[float]
    counts: list[int]
    sum: float = Field(ge=0)
    count: int = Field(ge=0)


class LegEvidence(_Doc):
    served: int = Field(ge=0, description="legs this engine answered in full")
    failed: dict[str, int] = Field(description="failed legs by reason (LegFailure.reason)")
    ttft_s: HistogramView = Field(description="prefill: leg latency; decode: first chunk after open")
    tpot_s: HistogramView | None = Field(default=None, description="decode only: time per output token")


class EngineEvidence(_Doc):
    prefill: LegEvidence
    decode: LegEvidence


class _Hist:
    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        value = max(0.0, value)
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def view(self) -> HistogramView:
        return HistogramView(
            bounds=list(self.bounds), counts=list(self.counts), sum=self.total, count=self.count
        )

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        acc = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            acc += n
            out.append((str(bound), acc))
        out.append(("+Inf", self.count))
        return out


class _Leg:
    __slots__ = ("failed", "served", "tpot", "ttft")

    def __init__(self, with_tpot: bool) -> None:
        self.served = 0
        self.failed: dict[str, int] = {}
        self.ttft = _Hist(TTFT_BUCKETS)
        self.tpot = _Hist(TPOT_BUCKETS) if with_tpot else None

    def view(self) -> LegEvidence:
        return LegEvidence(
            served=self.served,
            failed=dict(sorted(self.failed.items())),
            ttft_s=self.ttft.view(),
            tpot_s=self.tpot.view() if self.tpot is not None else None,
        )


class EngineStats:
    """Cumulative per-engine, per-leg serving evidence (bumped on the event loop, no locks)."""

    def __init__(self, iids: Iterable[str]) -> None:
        self.legs: dict[str, dict[str, _Leg]] = {
            iid: {"prefill": _Leg(False), "decode": _Leg(True)} for iid in iids
        }

    def prefill_served(self, iid: str, latency_s: float) -> None:
        leg = self.legs.get(iid)
        if leg is not None:
            p = leg["prefill"]
            p.served += 1
            p.ttft.observe(latency_s)

    def decode_served(self, iid: str | None, first_chunk_s: float | None, tpot_s: float | None) -> None:
        leg = self.legs.get(iid) if iid is not None else None
        if leg is None:
            return
        d = leg["decode"]
        d.served += 1
        if first_chunk_s is not None:
            d.ttft.observe(first_chunk_s)
        if tpot_s is not None and d.tpot is not None:
            d.tpot.observe(tpot_s)

    def leg_failed(self, iid: str, phase: str, reason: str) -> None:
        leg = self.legs.get(iid)
        if leg is not None and phase in leg:
            failed = leg[phase].failed
            failed[reason] = failed.get(reason, 0) + 1

    def snapshot(self) -> dict[str, EngineEvidence]:
        return {
            iid: EngineEvidence(prefill=legs["prefill"].view(), decode=legs["decode"].view())
            for iid, legs in sorted(self.legs.items())
        }

    def families(self) -> Iterator[Metric]:
        """The ``narwhal_engine_leg_*`` families (label ``engine``: configured engines only)."""
        served = CounterMetricFamily(
            "narwhal_engine_leg_served_total", "Legs an engine answered in full.", labels=["engine", "leg"]
        )
        failed = CounterMetricFamily(
            "narwhal_engine_leg_failed_total",
            "Failed legs by engine and reason.",
            labels=["engine", "leg", "reason"],
        )
        ttft = HistogramMetricFamily(
            "narwhal_engine_ttft_seconds",
            "Time to first token per engine: prefill leg latency; decode leg first chunk.",
            labels=["engine", "leg"],
        )
        tpot = HistogramMetricFamily(
            "narwhal_engine_tpot_seconds", "Time per output token of served decode legs.", labels=["engine"]
        )
        for iid, legs in sorted(self.legs.items()):
            for name in LEGS:
                leg = legs[name]
                served.add_metric([iid, name], leg.served)
                for reason, n in sorted(leg.failed.items()):
                    failed.add_metric([iid, name, reason], n)
                ttft.add_metric([iid, name], leg.ttft.cumulative(), leg.ttft.total)
                if leg.tpot is not None:
                    tpot.add_metric([iid], leg.tpot.cumulative(), leg.tpot.total)
        yield from (served, failed, ttft, tpot)
