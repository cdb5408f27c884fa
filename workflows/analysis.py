"""Canary analysis of a restart wave: is the restarted engine serving as well as the rest?

Pure and deterministic (no I/O, no clock, no randomness), so the restart workflow runs it in
workflow code on the evidence its activities recorded (workflows/canary.py):

- ``EvidenceSnapshot`` — what one sample activity read: each router's cumulative per-engine, per-leg
  evidence (``/narwhal/state`` ``engine_evidence``, router/engine_stats.py).
- ``window`` — two snapshots → what each engine did in between, summed over the routers (each
  active-active replica counts the legs it placed; a router whose counters went back — a restart —
  counts from zero; a router missing from either snapshot is left out and named).
- ``judge`` — one window → ``pass`` / ``fail`` / ``inconclusive`` comparing the restarted engines
  (the canary) with the baseline (engines not restarted yet) over the same window.
- ``Tally`` — the run of samples → continue, passed, failed, or ask the operator.

The policy (``AnalysisPolicy``, ``narwhal-restart start --analysis FILE``, JSON or YAML):

| field | meaning |
|---|---|
| ``bake_s`` | wait after the readmission before the first window opens |
| ``interval_s`` | length of one sample window |
| ``samples`` | passing samples needed to move on |
| ``min_requests`` | legs the canary and the baseline each need in a window for a verdict; fewer → inconclusive |
| ``max_failure_rate_margin`` | canary failure rate may exceed the baseline's by this much (0.02 = 2 points) |
| ``percentile`` | quantile read from the histogram buckets for TTFT and TPOT (0.9) |
| ``max_ttft_ratio`` / ``max_tpot_ratio`` | canary percentile ÷ baseline percentile above this → fail |
| ``failure_limit`` | failing samples that stop the rollout |
| ``inconclusive_limit`` | inconclusive samples tolerated; one more → wait for the operator (approve continues) |
| ``ignore_reasons`` | failure reasons that are not the engine's fault (client 4xx, response too big) |
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from narwhal_models.evidence import (
    AnalysisPolicy,
    Buckets,
    EngineCounters,
    EvidenceSnapshot,
    LegCounters,
    Sample,
    Side,
    Verdict,
)

LEGS: tuple[str, str] = ("prefill", "decode")
TallyState = Literal["continue", "passed", "failed", "ask_operator"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- one window ------------------------------------------------------------------------------------


def _sub_buckets(cur: Buckets | None, prev: Buckets | None) -> Buckets | None:
    if cur is None:
        return None
    if prev is None or prev.bounds != cur.bounds:
        return cur
    counts = [c - p for c, p in zip(cur.counts, prev.counts, strict=True)]
    return cur if any(n < 0 for n in counts) else Buckets(bounds=cur.bounds, counts=counts)


def _sub_leg(cur: LegCounters, prev: LegCounters) -> LegCounters:
    failed = {r: n - prev.failed.get(r, 0) for r, n in cur.failed.items()}
    if cur.served < prev.served or any(n < 0 for n in failed.values()):
        return cur  # counters went back: the router started again, count from zero
    return LegCounters(
        served=cur.served - prev.served,
        failed={r: n for r, n in failed.items() if n},
        ttft=_sub_buckets(cur.ttft, prev.ttft),
        tpot=_sub_buckets(cur.tpot, prev.tpot),
    )


def _add_buckets(a: Buckets | None, b: Buckets | None) -> Buckets | None:
    if a is None or b is None:
        return a or b
    if a.bounds != b.bounds:
        return a  # a router with other buckets cannot be added in; its legs still count
    return Buckets(bounds=a.bounds, counts=[x + y for x, y in zip(a.counts, b.counts, strict=True)])


def _add_leg(a: LegCounters, b: LegCounters) -> LegCounters:
    failed = dict(a.failed)
    for r, n in b.failed.items():
        failed[r] = failed.get(r, 0) + n
    return LegCounters(
        served=a.served + b.served,
        failed=failed,
        ttft=_add_buckets(a.ttft, b.ttft),
        tpot=_add_buckets(a.tpot, b.tpot),
    )


def _add_engine(a: EngineCounters, b: EngineCounters) -> EngineCounters:
    return EngineCounters(prefill=_add_leg(a.prefill, b.prefill), decode=_add_leg(a.decode, b.decode))


class Window(_Model):
    started: float
    ended: float
    engines: dict[str, EngineCounters] = Field(default_factory=dict)
    routers: list[str] = Field(default_factory=list)  # routers counted
    left_out: dict[str, str] = Field(default_factory=dict)  # router URL -> why it was not counted


def window(prev: EvidenceSnapshot, cur: EvidenceSnapshot) -> Window:
    """What every engine did between two snapshots, summed over the routers read both times."""
    engines: dict[str, EngineCounters] = {}
    left_out = dict(cur.unreachable)
    counted: list[str] = []
    for url in sorted(cur.routers):
        now = cur.routers[url]
        before = prev.routers.get(url)
        if before is None:
            left_out.setdefault(url, "not read at the start of the window")
            continue
        counted.append(url)
        restarted = bool(now.run and before.run and now.run != before.run)
        for iid, ec in now.engines.items():
            old = EngineCounters() if restarted else before.engines.get(iid, EngineCounters())
            delta = EngineCounters(
                prefill=_sub_leg(ec.prefill, old.prefill), decode=_sub_leg(ec.decode, old.decode)
            )
            engines[iid] = _add_engine(engines[iid], delta) if iid in engines else delta
    for url in prev.routers:
        if url not in cur.routers:
            left_out.setdefault(url, "not read at the end of the window")
    return Window(started=prev.at, ended=cur.at, engines=engines, routers=counted, left_out=left_out)


# -- percentiles from buckets ------------------------------------------------------------------------


def quantile(q: float, b: Buckets | None) -> float | None:
    """``histogram_quantile`` as Prometheus computes it: linear within the bucket holding rank
    ``q × total``; in the bucket above every bound, the highest bound. None without observations."""
    if b is None:
        return None
    total = sum(b.counts)
    if total <= 0:
        return None
    rank = q * total
    acc = 0
    for i, n in enumerate(b.counts):
        if n and acc + n >= rank:
            if i >= len(b.bounds):
                return b.bounds[-1] if b.bounds else None
            lower = b.bounds[i - 1] if i > 0 else 0.0
            upper = b.bounds[i]
            return lower + (upper - lower) * (rank - acc) / n
        acc += n
    return b.bounds[-1] if b.bounds else None


# -- one verdict -------------------------------------------------------------------------------------


def _side(w: Window, iids: Sequence[str], policy: AnalysisPolicy) -> tuple[Side, dict[str, LegCounters]]:
    legs = {name: LegCounters() for name in LEGS}
    for iid in iids:
        ec = w.engines.get(iid)
        if ec is not None:
            for name in LEGS:
                legs[name] = _add_leg(legs[name], ec.leg(name))
    ignored = set(policy.ignore_reasons)
    by_reason: dict[str, int] = {}
    for leg in legs.values():
        for r, n in leg.failed.items():
            if r not in ignored:
                by_reason[r] = by_reason.get(r, 0) + n
    failed = sum(by_reason.values())
    counted = sum(leg.served for leg in legs.values()) + failed
    side = Side(
        engines=sorted(iids),
        legs=counted,
        failed=failed,
        failure_rate=failed / counted if counted else None,
        failed_by_reason=dict(sorted(by_reason.items())),
        ttft_s={name: quantile(policy.percentile, legs[name].ttft) for name in LEGS},
        tpot_s=quantile(policy.percentile, legs["decode"].tpot),
    )
    return side, legs


def _ratio_breach(
    what: str, c: float | None, b: float | None, c_n: int, b_n: int, limit: float, policy: AnalysisPolicy
) -> str:
    if c is None or b is None or c_n < policy.min_requests or b_n < policy.min_requests:
        return ""
    ratio = c / b if b > 0 else float("inf")
    if ratio > limit:
        return f"{what} p{policy.percentile * 100:g} {c * 1000:.1f} ms vs baseline {b * 1000:.1f} ms (×{ratio:.2f} > ×{limit:g})"
    return ""


def judge(
    index: int, w: Window, canary: Sequence[str], baseline: Sequence[str], policy: AnalysisPolicy
) -> Sample:
    """One sample's verdict: ``fail`` when the canary breaches a condition against the baseline,
    ``inconclusive`` when either side has fewer than ``min_requests`` legs, else ``pass``."""
    c, c_legs = _side(w, canary, policy)
    b, b_legs = _side(w, baseline, policy)
    reasons: list[str] = []
    verdict: Verdict
    if c.legs < policy.min_requests or b.legs < policy.min_requests:
        verdict = "inconclusive"
        reasons.append(
            f"too little traffic: canary {c.legs} leg(s), baseline {b.legs} (min_requests {policy.min_requests})"
        )
    else:
        assert c.failure_rate is not None and b.failure_rate is not None
        if c.failure_rate - b.failure_rate > policy.max_failure_rate_margin:
            reasons.append(
                f"failure rate {c.failure_rate:.1%} vs baseline {b.failure_rate:.1%} "
                f"(margin {policy.max_failure_rate_margin:.1%})"
            )
        for name in LEGS:
            why = _ratio_breach(
                f"{name} TTFT", c.ttft_s[name], b.ttft_s[name],
                c_legs[name].served, b_legs[name].served, policy.max_ttft_ratio, policy,
            )  # fmt: skip
            if why:
                reasons.append(why)
        why = _ratio_breach(
            "TPOT",
            c.tpot_s,
            b.tpot_s,
            c_legs["decode"].served,
            b_legs["decode"].served,
            policy.max_tpot_ratio,
            policy,
        )
        if why:
            reasons.append(why)
        verdict = "fail" if reasons else "pass"
    return Sample(
        index=index, engines=sorted(canary), started=w.started, ended=w.ended, verdict=verdict,
        reasons=reasons, canary=c, baseline=b, routers=w.routers, left_out=w.left_out,
    )  # fmt: skip


def baseline_of(
    all_engines: Iterable[str], canary: Iterable[str], not_restarted: Iterable[str], passed: Iterable[str]
) -> list[str]:
    """The baseline: engines not restarted yet (outside the canary); when none is left, the engines
    restarted earlier in this run whose analysis passed."""
    c = set(canary)
    fresh = sorted(set(not_restarted) - c)
    if fresh:
        return fresh
    known = set(all_engines)
    return sorted(i for i in set(passed) - c if i in known)


# -- the run of samples ------------------------------------------------------------------------------


class Tally(_Model):
    passes: int = 0
    failures: int = 0
    inconclusive: int = 0

    def record(self, verdict: Verdict, policy: AnalysisPolicy) -> TallyState:
        if verdict == "pass":
            self.passes += 1
        elif verdict == "fail":
            self.failures += 1
        else:
            self.inconclusive += 1
        if self.failures >= policy.failure_limit:
            return "failed"
        if self.passes >= policy.samples:
            return "passed"
        if verdict == "inconclusive" and self.inconclusive > policy.inconclusive_limit:
            return "ask_operator"
        return "continue"


def load_policy(data: Mapping[str, object]) -> AnalysisPolicy:
    return AnalysisPolicy.model_validate(dict(data))
