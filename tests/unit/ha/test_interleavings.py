"""Every interleaving of 2–3 routers running the real control machine (``router.ha.machine``) on a
simulated store, with faults, to a bounded depth (``tests/unit/ha/control_model.py``).

Each scenario prints the states explored and the depth reached (``pytest -s``); docs/ha.md records
them. The broken variants (``broken_rules.py``) prove the check can fail.
"""

from __future__ import annotations

import pytest

from router.ha import machine as m
from tests.unit.ha import broken_rules as broken
from tests.unit.ha.control_model import Budget, Doc, StepFn, Store, World, explore, initial

ETCD = m.Rules(contends=True, renew_every=1, retry_every=1)
PRIMARY = m.Rules(renew_every=1, retry_every=1)  # file lease: fenced for good by a live holder
STANDBY = m.Rules(standby=True, takeover_after=1, probe_every=1, renew_every=1, retry_every=1)
PAIRS = {"etcd": (ETCD, ETCD), "standby": (PRIMARY, STANDBY), "etcd3": (ETCD, ETCD, ETCD)}
NONE = Budget(kills=0, freezes=0, partitions=0, errors=0, torn=0, changes=1)
ALL = Budget(kills=1, freezes=1, partitions=1, errors=1, torn=1, changes=1)
MAX_TIME = 14

# (pair, faults, depth, warm: start from router 0 controlling epoch 1)
SCENARIOS = {
    "etcd-kill": ("etcd", NONE._replace(kills=1, changes=2), 18, True),
    "etcd-freeze-partition": ("etcd", NONE._replace(freezes=1, partitions=1), 16, True),
    "etcd-errors-torn-kill": ("etcd", NONE._replace(errors=1, torn=1, kills=1), 16, True),
    "standby-kill": ("standby", NONE._replace(kills=1, changes=2), 18, True),
    "standby-two-freezes": ("standby", NONE._replace(freezes=2), 16, True),
    "standby-freeze-partition": ("standby", NONE._replace(freezes=1, partitions=1), 16, True),
    "standby-errors-torn-kill": ("standby", NONE._replace(errors=1, torn=1, kills=1), 16, True),
    "etcd-cold-every-fault": ("etcd", ALL, 9, False),
    "standby-cold-every-fault": ("standby", ALL, 9, False),
    "etcd3-kill-freeze": ("etcd3", NONE._replace(kills=1, freezes=1), 12, True),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_interleaving_keeps_the_invariants(name: str) -> None:
    pair, faults, depth, warm = SCENARIOS[name]
    result = explore(PAIRS[pair], faults, depth=depth, max_time=MAX_TIME, warm=warm)
    print(f"{name}: {result.states} states, depth {result.depth}")
    assert result.violation is None, str(result.violation)
    assert result.depth == depth  # the bound was reached, not cut short


BROKEN: dict[str, tuple[StepFn, str, Budget, str]] = {
    "takes over without fencing": (broken.takes_over_without_fencing, "etcd", NONE, "control at once"),
    "acks before persisting": (
        broken.acks_before_persisting,
        "etcd",
        NONE._replace(kills=1),
        "without acknowledged changes",
    ),
    "gives up a slow takeover": (
        broken.gives_up_a_slow_takeover,
        "standby",
        NONE._replace(freezes=2, changes=0),
        "no router controls after faults healed",
    ),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_rule_is_found(name: str) -> None:
    step, pair, faults, expected = BROKEN[name]
    result = explore(PAIRS[pair], faults, depth=18, max_time=MAX_TIME, step=step, warm=True)
    assert result.violation is not None, f"{name}: no counterexample in {result.states} states"
    assert expected in result.violation.what
    print(f"{name}: counterexample after {result.states} states:\n{result.violation}")


def test_the_same_scenario_passes_with_the_real_rules() -> None:
    """The slow-takeover counterexample needs two freezes; the real machine retries and recovers."""
    result = explore(
        PAIRS["standby"], NONE._replace(freezes=2, changes=0), depth=18, max_time=MAX_TIME, warm=True
    )
    assert result.violation is None, str(result.violation)


def after_a_partitioned_controller_was_replaced() -> World:
    """Router 0 held epoch 1, lost it to a partition and is re-claiming (healed now); meanwhile
    router 1 controlled epoch 2, acknowledged change 1 (in the stored handoff) and was killed (its
    new process is frozen), its lease expired. One store error left."""
    world = initial(PAIRS["etcd"], NONE._replace(errors=1, changes=0))
    c0 = m.Control[Doc](phase=m.Phase.WAIT, entry=m.Entry.RECLAIM, previous=1, seen=1, due=10)
    r0, r1 = world.routers
    return world._replace(
        now=10,
        store=Store(holder=None, epoch=2, expires=9, doc=Doc(2, 8, frozenset({1}))),
        routers=(r0._replace(c=c0), r1._replace(inc=3, frozen=True)),
        next_inc=4,
        acked=frozenset({1}),
        controllers=frozenset({(1, 1), (2, 2)}),
        max_controlled=2,
    )


def test_a_reclaim_over_an_unreadable_handoff_loses_an_acknowledged_change_the_machine_reads_again() -> None:
    """The keeper's re-claim rule (an unreadable shared handoff = nothing newer) vs the machine's."""
    start = after_a_partitioned_controller_was_replaced()
    old = explore(
        PAIRS["etcd"], start.budget, 8, MAX_TIME, broken.reclaims_over_an_unreadable_handoff, start=start
    )
    assert old.violation is not None and "without acknowledged changes [1]" in old.violation.what
    new = explore(PAIRS["etcd"], start.budget, 8, MAX_TIME, start=start)
    assert new.violation is None, str(new.violation)
