"""The canary analysis's documents: its policy, the evidence a sample activity returns, and one
recorded sample — shared by the restart workflows (workflows/analysis.py judges them) and the
activities (activities/evidence.py reads them from the routers).

Crosses the Temporal boundary and is imported by workflow code, so: stdlib + pydantic only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Verdict = Literal["pass", "fail", "inconclusive"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AnalysisPolicy(_Model):
    """How a restarted engine is judged (see the module docstring)."""

    bake_s: float = Field(default=30.0, ge=0)
    interval_s: float = Field(default=30.0, gt=0)
    samples: int = Field(default=3, ge=1)
    min_requests: int = Field(default=20, ge=1)
    max_failure_rate_margin: float = Field(default=0.02, ge=0, le=1)
    percentile: float = Field(default=0.9, gt=0, lt=1)
    max_ttft_ratio: float = Field(default=2.0, ge=1)
    max_tpot_ratio: float = Field(default=2.0, ge=1)
    failure_limit: int = Field(default=1, ge=1)
    inconclusive_limit: int = Field(default=2, ge=0)
    ignore_reasons: list[str] = Field(default_factory=lambda: ["engine_rejected", "response_limit"])


# -- evidence (what the sample activity returns) ---------------------------------------------------


class Buckets(_Model):
    """A latency histogram: ``counts`` per bucket (``len(bounds) + 1``, the last above every bound)."""

    bounds: list[float]
    counts: list[int]

    @model_validator(mode="after")
    def _shape(self) -> Buckets:
        if len(self.counts) != len(self.bounds) + 1:
            raise ValueError(f"{len(self.counts)} counts for {len(self.bounds)} bounds")
        return self


class LegCounters(_Model):
    served: int = Field(default=0, ge=0)
    failed: dict[str, int] = Field(default_factory=dict)
    ttft: Buckets | None = None
    tpot: Buckets | None = None


class EngineCounters(_Model):
    prefill: LegCounters = Field(default_factory=LegCounters)
    decode: LegCounters = Field(default_factory=LegCounters)

    def leg(self, name: str) -> LegCounters:
        return self.prefill if name == "prefill" else self.decode


class RouterEvidence(_Model):
    run: str = ""  # the router process's run id: another id = the counters started again
    engines: dict[str, EngineCounters] = Field(default_factory=dict)


class EvidenceSnapshot(_Model):
    at: float
    routers: dict[str, RouterEvidence] = Field(default_factory=dict)
    unreachable: dict[str, str] = Field(default_factory=dict)  # router URL -> why it was not read


# -- one verdict, as recorded ------------------------------------------------------------


class Side(_Model):
    """The canary's or the baseline's evidence in one window."""

    engines: list[str]
    legs: int = Field(ge=0, description="legs counted: served + failed (ignored reasons left out)")
    failed: int = Field(ge=0)
    failure_rate: float | None
    failed_by_reason: dict[str, int] = Field(default_factory=dict)
    ttft_s: dict[str, float | None] = Field(default_factory=dict, description="per leg, at the percentile")
    tpot_s: float | None = None


class Sample(_Model):
    """One analysis sample as recorded in the workflow (and shown in Current Details)."""

    index: int = Field(ge=1)
    engines: list[str]
    started: float
    ended: float
    verdict: Verdict
    reasons: list[str]
    canary: Side
    baseline: Side
    routers: list[str] = Field(default_factory=list)
    left_out: dict[str, str] = Field(default_factory=dict)
