"""Role floors (controller.min_prefill / min_decode): the lifecycle refuses a drain below a floor
(409 naming the role) and the breaker spares an ejection below it — one rule (Scheduler.floor_breach)."""

from __future__ import annotations

from typing import Any

import pytest

from router.breaker import Breaker
from router.clock import FakeClock
from router.config import parse_fleet
from router.lifecycle.machine import LifecycleError, LifecycleMachine
from router.scheduler import Scheduler


def setup(
    min_prefill: int = 1, min_decode: int = 1, pins: bool = False
) -> tuple[LifecycleMachine, Breaker, Scheduler]:
    cfg = parse_fleet(
        {
            "model": "m",
            "engines": [
                {"iid": "p0", "url": "http://127.0.0.1:1", "role": "prefill", "pin": pins},
                {"iid": "p1", "url": "http://127.0.0.1:2", "role": "prefill", "pin": pins},
                {"iid": "d0", "url": "http://127.0.0.1:3", "role": "decode", "pin": pins},
                {"iid": "d1", "url": "http://127.0.0.1:4", "role": "decode", "pin": pins},
            ],
            "controller": {"min_prefill": min_prefill, "min_decode": min_decode},
        }
    )
    clock = FakeClock()
    sched = Scheduler.from_specs(
        cfg.engines, floors={"prefill": min_prefill, "decode": min_decode}, now=clock.monotonic
    )
    return LifecycleMachine(cfg, sched, clock), Breaker(sched, clock, eject_after=1), sched


def test_pinned_roles_a_drain_below_the_floor_is_refused_naming_the_role() -> None:
    machine, _, sched = setup(min_prefill=2, pins=True)
    with pytest.raises(LifecycleError) as err:
        machine.begin(["p0"], wave=False, deadline_s=60)
    assert str(err.value) == (
        "draining p0 would leave 1 engine(s) able to serve the prefill role, below controller.min_prefill = 2"
    )
    assert sched.draining == set() and machine.records == {}  # nothing changed
    machine.begin(["d0"], wave=False, deadline_s=60)  # decode floor 1: d1 remains
    assert sched.draining == {"d0"}


def test_unpinned_engines_count_for_both_roles() -> None:
    machine, _, sched = setup(min_prefill=3, min_decode=3)
    sched.ejected["d1"] = "connection"  # 3 unpinned engines left, each able to serve both roles
    with pytest.raises(LifecycleError, match=r"below controller.min_prefill = 3"):
        machine.begin(["p1"], wave=False, deadline_s=60)
    assert sched.draining == set()
    sched.ejected.clear()
    machine.begin(["p1"], wave=False, deadline_s=60)  # 3 remain: at the floor, allowed
    assert sched.draining == {"p1"}


def test_a_whole_wave_drain_is_not_bound_by_floors() -> None:
    machine, _, sched = setup(min_prefill=2, min_decode=2, pins=True)
    machine.begin([], wave=True, deadline_s=60)
    assert sched.draining == {"p0", "p1", "d0", "d1"}


def test_breaker_spares_what_the_floor_needs() -> None:
    _, breaker, sched = setup(min_decode=2, pins=True)
    assert breaker.record_failure("p0", "connection").action == "eject"  # prefill floor 1: p1 remains
    d = breaker.record_failure("d0", "connection")
    assert d.action == "spared" and "d0" not in sched.ejected  # decode floor 2 with 2 decode engines
    assert breaker.spared[("d0", "connection")] == 1


def test_floor_zero_lets_the_breaker_take_the_last_engine() -> None:
    _, breaker, sched = setup(min_prefill=0, pins=True)
    assert breaker.record_failure("p0", "connection").action == "eject"
    assert breaker.record_failure("p1", "connection").action == "eject"
    assert sched.ejected.keys() == {"p0", "p1"}


@pytest.mark.parametrize("floors", [{"min_prefill": 3}, {"min_decode": 5}])
def test_config_refuses_floors_the_fleet_cannot_meet(floors: dict[str, Any]) -> None:
    from router.config import ConfigError

    doc = {
        "model": "m",
        "engines": [
            {"iid": "p0", "url": "http://127.0.0.1:1", "role": "prefill", "pin": True},
            {"iid": "p1", "url": "http://127.0.0.1:2", "role": "prefill", "pin": True},
            {"iid": "d0", "url": "http://127.0.0.1:3", "role": "decode", "pin": True},
        ],
        "controller": floors,
    }
    with pytest.raises(ConfigError, match=r"controller.min_(prefill|decode) = \d exceeds"):
        parse_fleet(doc)
