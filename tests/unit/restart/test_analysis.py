"""The canary analysis (workflows/analysis.py): windows, percentiles, verdicts, the tally.

Pure functions on recorded evidence; hypothesis checks the properties the workflow relies on: an
engine serving exactly like its baseline never fails, a run of samples always ends, quantiles stay
inside the buckets and grow with q.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from narwhal_models.evidence import (
    AnalysisPolicy,
    Buckets,
    EngineCounters,
    EvidenceSnapshot,
    LegCounters,
    RouterEvidence,
    Verdict,
)
from workflows.analysis import (
    Tally,
    baseline_of,
    judge,
    quantile,
    window,
)

BOUNDS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]
POLICY = AnalysisPolicy(min_requests=20, max_failure_rate_margin=0.02, max_ttft_ratio=2.0, percentile=0.9)


def hist(at: float, n: int) -> Buckets:
    """``n`` observations in the bucket whose upper bound is ``at``."""
    counts = [0] * (len(BOUNDS) + 1)
    counts[BOUNDS.index(at)] = n
    return Buckets(bounds=BOUNDS, counts=counts)


def engine(
    prefill: int = 0, failed: int = 0, ttft: float = 0.025, decode: int = 0, tpot: float = 0.0025
) -> EngineCounters:
    return EngineCounters(
        prefill=LegCounters(
            served=prefill, failed={"engine_error": failed} if failed else {}, ttft=hist(ttft, prefill)
        ),
        decode=LegCounters(served=decode, ttft=hist(0.005, decode), tpot=hist(tpot, decode)),
    )


def snap(at: float, **routers: dict[str, EngineCounters]) -> EvidenceSnapshot:
    return EvidenceSnapshot(
        at=at, routers={f"http://{k}": RouterEvidence(run=k, engines=v) for k, v in routers.items()}
    )


ZERO = {"e0": engine(), "e1": engine(), "d0": engine()}


def sample(cur: dict[str, EngineCounters], policy: AnalysisPolicy = POLICY) -> Any:
    w = window(snap(0.0, r1=ZERO), snap(30.0, r1=cur))
    return judge(1, w, ["e0"], ["e1"], policy)


def test_a_healthy_canary_passes() -> None:
    s = sample({"e0": engine(prefill=50), "e1": engine(prefill=60)})
    assert s.verdict == "pass" and s.reasons == []
    assert (s.canary.legs, s.baseline.legs, s.canary.failure_rate) == (50, 60, 0.0)


def test_a_canary_failing_a_fifth_of_its_legs_fails_with_the_evidence() -> None:
    s = sample({"e0": engine(prefill=40, failed=10), "e1": engine(prefill=60)})
    assert s.verdict == "fail"
    assert s.canary.failure_rate == 0.2 and s.canary.failed_by_reason == {"engine_error": 10}
    assert s.reasons == ["failure rate 20.0% vs baseline 0.0% (margin 2.0%)"]


def test_three_times_the_ttft_fails_and_names_the_leg() -> None:
    s = sample({"e0": engine(prefill=50, ttft=0.1), "e1": engine(prefill=50, ttft=0.025)})
    assert s.verdict == "fail"
    assert len(s.reasons) == 1 and s.reasons[0].startswith("prefill TTFT p90")
    assert s.canary.ttft_s["prefill"] is not None and s.baseline.ttft_s["prefill"] is not None
    assert s.canary.ttft_s["prefill"] / s.baseline.ttft_s["prefill"] > 2


def test_tpot_ratio_is_judged_on_decode_legs() -> None:
    s = sample({"e0": engine(decode=50, tpot=0.01), "e1": engine(decode=50, tpot=0.0025)})
    assert s.verdict == "fail" and s.reasons[0].startswith("TPOT p90")


def test_too_little_traffic_is_inconclusive_not_a_pass() -> None:
    s = sample({"e0": engine(prefill=5), "e1": engine(prefill=60)})
    assert s.verdict == "inconclusive"
    assert "canary 5 leg(s)" in s.reasons[0]


def test_ignored_reasons_are_not_the_engines_fault() -> None:
    e0 = engine(prefill=40)
    e0.prefill.failed = {"engine_rejected": 30}
    s = sample({"e0": e0, "e1": engine(prefill=60)})
    assert s.verdict == "pass" and s.canary.failed == 0


def test_windows_sum_replicas_and_count_a_restarted_router_from_zero() -> None:
    prev = snap(0.0, r1={"e0": engine(prefill=100)}, r2={"e0": engine(prefill=10)})
    cur = snap(10.0, r1={"e0": engine(prefill=130)}, r2={"e0": engine(prefill=25)})
    assert window(prev, cur).engines["e0"].prefill.served == 30 + 15
    # r2 restarted (another run id): its counters count from zero
    cur.routers["http://r2"] = RouterEvidence(run="r2-new", engines={"e0": engine(prefill=4)})
    w = window(prev, cur)
    assert w.engines["e0"].prefill.served == 30 + 4
    # a router read only at the end is left out and named
    cur.routers["http://r3"] = RouterEvidence(run="r3", engines={"e0": engine(prefill=1000)})
    w = window(prev, cur)
    assert w.engines["e0"].prefill.served == 34 and "http://r3" in w.left_out


def test_baseline_is_the_not_yet_restarted_engines_else_those_that_passed() -> None:
    assert baseline_of(["a", "b", "c"], ["a"], ["b", "c"], []) == ["b", "c"]
    assert baseline_of(["a", "b", "c"], ["c"], [], ["a", "b"]) == ["a", "b"]


def test_the_policy_refuses_nonsense() -> None:
    with pytest.raises(ValidationError):
        AnalysisPolicy(percentile=1.5)
    with pytest.raises(ValidationError):
        AnalysisPolicy.model_validate({"bake": 3})  # unknown key: a typo is not silently ignored


counts = st.lists(st.integers(min_value=0, max_value=50), min_size=len(BOUNDS) + 1, max_size=len(BOUNDS) + 1)


@given(counts, st.floats(min_value=0.01, max_value=0.99), st.floats(min_value=0.01, max_value=0.99))
def test_quantiles_stay_in_the_buckets_and_grow_with_q(c: list[int], q1: float, q2: float) -> None:
    b = Buckets(bounds=BOUNDS, counts=c)
    lo, hi = sorted((q1, q2))
    a, z = quantile(lo, b), quantile(hi, b)
    if sum(c) == 0:
        assert a is None and z is None
        return
    assert a is not None and z is not None
    assert 0.0 <= a <= z <= BOUNDS[-1]


legs_st = st.builds(
    lambda served, failed, ttft, tpot: LegCounters(
        served=served,
        failed={"engine_error": failed} if failed else {},
        ttft=Buckets(bounds=BOUNDS, counts=ttft),
        tpot=Buckets(bounds=BOUNDS, counts=tpot),
    ),
    st.integers(0, 500),
    st.integers(0, 100),
    counts,
    counts,
)


@given(legs_st, legs_st)
def test_an_engine_serving_like_its_baseline_never_fails(p: LegCounters, d: LegCounters) -> None:
    same = EngineCounters(prefill=p, decode=d)
    w = window(snap(0.0, r1={}), snap(30.0, r1={"c": same, "b": same}))
    assert judge(1, w, ["c"], ["b"], POLICY).verdict in ("pass", "inconclusive")


@given(
    st.lists(st.sampled_from(["pass", "fail", "inconclusive"]), min_size=30, max_size=30),
    st.integers(1, 5),
    st.integers(1, 3),
    st.integers(0, 4),
)
def test_a_run_of_samples_always_ends(verdicts: list[Verdict], samples: int, fl: int, il: int) -> None:
    policy = AnalysisPolicy(samples=samples, failure_limit=fl, inconclusive_limit=il)
    tally = Tally()
    bound = samples + fl + il
    for n, v in enumerate(verdicts, start=1):
        state = tally.record(v, policy)
        if state != "continue":
            assert n <= bound
            assert state != "failed" or tally.failures == fl
            break
    else:
        raise AssertionError("30 samples without an end")
