"""Consolidation-risk tracker (spec §9.3) on a fake clock."""

from __future__ import annotations

import pytest

from router.clock import FakeClock
from router.ha.demand_risk import DemandRisk, DemandRiskDoc


def test_no_event_is_null() -> None:
    assert DemandRisk(FakeClock()).snapshot() is None


def test_latest_kind_age_and_counts() -> None:
    clock = FakeClock()
    risk = DemandRisk(clock)
    risk.record("first_token_timeout")
    clock.advance(3.0)
    risk.record("p_to_d_recovery")
    clock.advance(2.0)
    risk.record("first_token_timeout")
    clock.advance(0.5)
    clock.jump_wall(-1000)  # wall-clock steps do not age the event
    snap = risk.snapshot()
    assert snap == DemandRiskDoc(
        kind="first_token_timeout", age_s=0.5, events={"first_token_timeout": 2, "p_to_d_recovery": 1}
    )


def test_rearm_reanchors_age_and_adds_counts() -> None:
    clock = FakeClock(monotonic=10.0)
    risk = DemandRisk(clock)
    risk.record("first_token_timeout")
    risk.rearm(DemandRiskDoc(kind="p_to_d_recovery", age_s=100.0, events={"p_to_d_recovery": 4}))
    snap = risk.snapshot()
    assert snap is not None and snap.kind == "first_token_timeout" and snap.age_s == 0.0
    assert snap.events == {"first_token_timeout": 1, "p_to_d_recovery": 4}
    fresh = DemandRisk(FakeClock(monotonic=5.0))  # age may reach back before our own clock's zero
    fresh.rearm(DemandRiskDoc(kind="p_to_d_recovery", age_s=100.0, events={}))
    later = fresh.snapshot()
    assert later is not None and later.age_s == 100.0 and later.events == {}
    fresh.rearm(None)
    assert fresh.snapshot() == later


def test_empty_kind_is_refused() -> None:
    with pytest.raises(ValueError):
        DemandRisk(FakeClock()).record("")
