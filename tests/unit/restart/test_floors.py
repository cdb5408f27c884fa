"""The workflows' floor rule (workflows/floors.py, fed from the router's API) and the router's own
(``Scheduler.floor_breach``) give the same verdict on every small fleet: labelled or unpinned
engines count, placement-eligible only, floors 0–2 per role, every one- and two-engine drain."""

from __future__ import annotations

import itertools

from router.scheduler import EngineRuntime, Scheduler
from workflows.floors import floor_breach

ROLES = ("prefill", "decode")


def fleets() -> itertools.chain[tuple[tuple[str, ...], tuple[bool, ...], tuple[bool, ...]]]:
    return itertools.chain.from_iterable(
        itertools.product(
            itertools.product(ROLES, repeat=n),
            itertools.product((True, False), repeat=n),
            itertools.product((True, False), repeat=n),
        )
        for n in (1, 2, 3)
    )


def test_the_workflow_rule_is_the_routers_rule() -> None:
    compared = 0
    for roles_t, pins_t, eligible_t in fleets():
        iids = [f"e{i}" for i in range(len(roles_t))]
        roles = dict(zip(iids, roles_t, strict=True))
        pins = dict(zip(iids, pins_t, strict=True))
        eligible = [i for i, ok in zip(iids, eligible_t, strict=True) if ok]
        for fp, fd in itertools.product((0, 1, 2), repeat=2):
            floors = {"prefill": fp, "decode": fd}
            sched = Scheduler(
                engines={i: EngineRuntime(i, f"http://{i}", roles[i], pins[i], "") for i in iids},  # type: ignore[arg-type]
                draining={i for i in iids if i not in eligible},
                floors=floors,  # type: ignore[arg-type]
            )
            for k in (1, 2):
                for without in itertools.combinations(iids, k):
                    ours = floor_breach(roles, pins, eligible, floors, without)
                    theirs = sched.floor_breach(without)
                    assert (ours is None) == (theirs is None), (roles, pins, eligible, floors, without)
                    if ours is not None and theirs is not None:
                        assert tuple(ours) == tuple(theirs)
                    compared += 1
    assert compared > 5000


def test_the_vllm_two_engine_fleet_may_drain_either_engine() -> None:
    """docs/vllm.md: one prefill and one decode engine, unpinned, floors 1/1."""
    roles, pins, floors = (
        {"e0": "prefill", "e1": "decode"},
        {"e0": False, "e1": False},
        {"prefill": 1, "decode": 1},
    )
    assert floor_breach(roles, pins, ["e0", "e1"], floors, ["e0"]) is None
    assert floor_breach(roles, pins, ["e0", "e1"], floors, ["e1"]) is None
    assert floor_breach(roles, {"e0": True, "e1": True}, ["e0", "e1"], floors, ["e0"]) == ("prefill", 0, 1)
    assert floor_breach(roles, pins, ["e0", "e1"], floors, ["e0", "e1"]) == ("prefill", 0, 1)
