"""Property tests: random operation sequences keep the machine's invariants."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.lifecycle.machine import HOLD_STATES, LifecycleError, Verdict

from .helpers import machine

IIDS = ["e0", "e1", "e2"]
engine_sets = st.lists(st.sampled_from([*IIDS, "zz"]), max_size=4)
ops = st.one_of(
    st.tuples(
        st.just("begin"), engine_sets, st.booleans(), st.sampled_from([-1.0, 0.0, 1.0, 5.0, float("nan")])
    ),
    st.tuples(st.just("capture"), st.sampled_from(IIDS), st.one_of(st.floats(1, 1e9), st.just("unreadable"))),
    st.tuples(st.just("advance"), st.floats(0, 10)),
    st.tuples(st.just("resident"), st.sampled_from(IIDS), st.integers(0, 3)),
    st.tuples(st.just("readmit"), engine_sets, st.booleans(), st.booleans()),
    st.tuples(st.just("eject"), st.sampled_from(IIDS)),
    st.tuples(st.just("recover"), st.sampled_from(IIDS)),
    st.tuples(st.just("restart_wave"), st.booleans()),
    st.tuples(st.just("roundtrip")),
)


def apply(m: Any, sched: Any, clock: Any, op: tuple[Any, ...]) -> None:
    kind = op[0]
    try:
        if kind == "begin":
            m.begin(op[1], op[2], op[3])
        elif kind == "capture":
            if m.records.get(op[1]) is not None and m.records[op[1]].state in ("draining", "blocked"):
                m.bind_capture(op[1], op[2])
        elif kind == "advance":
            clock.advance(op[1])
        elif kind == "resident":
            sched.engines[op[1]].resident_decode = op[2]
        elif kind == "readmit":
            targets = m.mark_validating(op[1], op[2])
            m.complete_validation(
                {i: Verdict(process_start=1e10, errors=[] if op[3] else ["bad"]) for i in targets}
            )
        elif kind == "eject":
            sched.ejected[op[1]] = "liveness"
        elif kind == "recover":
            targets = m.start_recovery([op[1]], False)
            m.complete_validation({i: Verdict(process_start=1e10) for i in targets})
        elif kind == "restart_wave":
            m.require_restart_wave("engine e0 was excluded", reset=op[1])
        elif kind == "roundtrip":
            m.restore(m.snapshot())
    except LifecycleError:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["individual", "whole_wave"]), st.lists(ops, max_size=25))
def test_invariants_hold_for_any_sequence(policy: str, sequence: list[tuple[Any, ...]]) -> None:
    m, sched, clock = machine(policy=policy)
    for op in sequence:
        apply(m, sched, clock, op)
        m.refresh()
        held = {i for i, r in m.records.items() if r.state in HOLD_STATES}
        # placement follows the records: every hold is out of placement, nothing else is
        assert sched.draining == held
        # a wave means a router-wide hold over every engine, and nothing else sets it
        assert bool(sched.fleet_hold) == bool(m.wave_id)
        if m.wave_id:
            assert sorted(m.wave_members()) == IIDS
        else:
            assert all(r.wave_id == "" for r in m.records.values() if r.state in HOLD_STATES)
        for iid, rec in m.records.items():
            if m.ready_to_stop(iid):
                assert rec.state == "drained" and rec.old_process_start is not None
                assert sched.engines[iid].resident == 0 and not sched.accepts_new(iid)
            if rec.state == "active":
                assert iid not in sched.draining
        assert len(m.events) <= 200
        # the snapshot is always restorable
        m2, _, _ = machine(policy=policy)
        m2.restore(m.snapshot())
