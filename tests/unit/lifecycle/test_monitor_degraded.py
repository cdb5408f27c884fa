"""Monitor pass stage isolation and "monitoring degraded" (spec §7.1), in-process on a fake clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from router.clock import FakeClock
from router.core import RouterCore
from router.engines.control import EngineControl
from router.ha.service import HAService
from router.ha.settings import HARuntime
from router.journal import Journal
from router.lifecycle.monitor import LifecycleMonitor, MonitorHealth
from router.lifecycle.service import LifecycleService

from .fake_engines import FakeFleet
from .helpers import fleet


class Boom(RuntimeError):
    pass


class Stage:
    """An injectable monitor stage that fails while ``failing`` is set and counts its calls."""

    def __init__(self, failing: bool = False) -> None:
        self.failing = failing
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        if self.failing:
            raise Boom("stage broke")


def setup(limit: int = 3, **extra: Any) -> tuple[RouterCore, LifecycleMonitor, FakeFleet]:
    cfg = fleet(3, controller={"monitor_failure_limit": limit}, recovery={"liveness_every": 1}, **extra)
    core = RouterCore(config=cfg, journal=Journal(None), clock=FakeClock())
    fake = FakeFleet(3)
    service = LifecycleService(core, control=EngineControl(cfg, transport=fake.transport()))
    return core, LifecycleMonitor(core, service), fake


def events(core: RouterCore, name: str) -> list[dict[str, Any]]:
    return [r for r in core.journal.recent if r.get("event") == name]


async def test_degraded_after_limit_consecutive_failing_passes_and_recovers_after_a_clean_pass() -> None:
    core, monitor, _ = setup(limit=3)
    stage = Stage(failing=True)
    monitor.add_stage("probe", stage)
    for _ in range(2):
        await monitor.pass_once()
    assert core.monitoring_degraded == "" and core.ready()
    await monitor.pass_once()
    assert core.monitoring_degraded == "probe Boom"
    assert not core.ready() and not core.control_ready()
    assert core.ready_reason() == "monitoring degraded: probe Boom"
    assert core.prefill_hold_reason() == "monitoring degraded: probe Boom"
    assert core.health_status() == "degraded"
    assert len(events(core, "monitoring_stage_failure")) == 3
    (deg,) = events(core, "monitoring_degraded")
    assert deg["reason"] == "probe Boom" and deg["failing_passes"] == 3 and deg["limit"] == 3

    for _ in range(5):  # still failing: no row flood, one degraded event
        await monitor.pass_once()
    assert len(events(core, "monitoring_stage_failure")) == 3
    assert len(events(core, "monitoring_degraded")) == 1

    stage.failing = False
    await monitor.pass_once()
    assert core.monitoring_degraded == "" and core.ready() and core.prefill_hold_reason() == ""
    (rec,) = events(core, "monitoring_recovered")
    assert rec["was"] == "probe Boom" and rec["failing_passes"] == 8


async def test_a_clean_pass_resets_the_streak() -> None:
    core, monitor, _ = setup(limit=2)
    stage = Stage(failing=True)
    monitor.add_stage("probe", stage)
    await monitor.pass_once()
    stage.failing = False
    await monitor.pass_once()
    stage.failing = True
    await monitor.pass_once()
    assert core.monitoring_degraded == ""
    await monitor.pass_once()
    assert core.monitoring_degraded == "probe Boom"
    assert events(core, "monitoring_recovered") == []  # was never degraded before


async def test_a_failing_stage_does_not_stop_the_others() -> None:
    core, monitor, _ = setup(limit=1)

    async def broken_liveness() -> None:
        raise Boom("liveness")

    monitor.liveness_sweep = broken_liveness  # type: ignore[method-assign]
    later = Stage()
    monitor.add_stage("later", later)
    await monitor.pass_once()
    assert later.calls == 1  # ran after the failing liveness stage
    assert core.identities_ready  # the identity stage ran before it
    assert core.monitoring_degraded == "liveness Boom"
    (row,) = events(core, "monitoring_stage_failure")
    assert row["stage"] == "liveness" and row["error"] == "Boom: liveness" and row["consecutive"] == 1


async def test_reason_names_the_first_failing_stage_of_the_latest_pass() -> None:
    core, monitor, _ = setup(limit=1)
    first, second = Stage(failing=True), Stage(failing=True)
    monitor.add_stage("first", first)
    monitor.add_stage("second", second)
    await monitor.pass_once()
    assert core.monitoring_degraded == "first Boom"
    first.failing = False
    await monitor.pass_once()
    assert core.monitoring_degraded == "second Boom"
    assert [e["reason"] for e in events(core, "monitoring_degraded")] == ["first Boom", "second Boom"]


async def test_a_whole_wave_hold_runs_registered_stages_but_only_a_full_pass_clears() -> None:
    core, monitor, _ = setup(limit=1)
    stage = Stage(failing=True)
    monitor.add_stage("handoff", stage)
    await monitor.pass_once()
    assert core.monitoring_degraded == "handoff Boom"
    core.scheduler.fleet_hold = "whole-wave drain wave-1"
    stage.failing = False
    passes = monitor.passes
    await monitor.pass_once()
    assert stage.calls == 2 and monitor.passes == passes  # built-in stages skipped under the hold
    assert core.monitoring_degraded == "handoff Boom"  # a partial pass does not clear
    core.scheduler.fleet_hold = ""
    await monitor.pass_once()
    assert core.monitoring_degraded == ""


async def test_not_controlling_skips_the_pass_entirely() -> None:
    core, monitor, _ = setup(limit=1)
    stage = Stage(failing=True)
    monitor.add_stage("probe", stage)
    core.control.standby = True
    await monitor.pass_once()
    assert stage.calls == 0 and core.monitoring_degraded == ""


async def test_handoff_write_is_a_monitor_stage_that_degrades_control_not_serving(tmp_path: Path) -> None:
    core, monitor, _ = setup(limit=2)
    (tmp_path / "not-a-dir").write_text("")
    bad = tmp_path / "not-a-dir" / "state.json"  # unwritable: its parent is a file
    ha = HAService(core, HARuntime(state_path=str(bad)), lifecycle=monitor.service, monitor=monitor)
    await ha.start()
    try:
        assert ha.monitored and ("handoff", ha.write_handoff) in monitor.stages
        assert ha._tasks.running == 0  # no writer loop of its own: the monitor pass writes
        at_start = ha.persist_failures  # the state written when control is taken (its epoch) failed too
        assert at_start == 1
        await monitor.pass_once()
        await monitor.pass_once()
        assert ha.persist_failures == at_start + 2 and core.monitoring_degraded == ""  # serving goes on
        assert core.persist_degraded.startswith(f"state not persisted: state file {bad} not written: ")
        assert core.ready() and core.prefill_hold_reason() == ""
        assert "narwhal_persist_failures_total 3" in list(ha.metric_lines())
        ha.persister.state_path = tmp_path / "state.json"
        await monitor.pass_once()
        assert core.persist_degraded == "" and (tmp_path / "state.json").exists()
        assert "narwhal_persist_degraded 0" in list(ha.metric_lines())
    finally:
        await ha.stop()


def test_monitor_health_is_pure() -> None:
    h = MonitorHealth(limit=2)
    assert h.record([], 1.0) == []
    rows = h.record([("liveness", ValueError("x")), ("handoff", OSError("disk"))], 2.0)
    assert [r["stage"] for r in rows] == ["liveness", "handoff"] and h.degraded == ""
    rows = h.record([("handoff", OSError("disk"))], 3.0)
    assert rows[-1] == {
        "event": "monitoring_degraded", "at": 3.0, "reason": "handoff OSError", "failing_passes": 2, "limit": 2,
    }  # fmt: skip
    assert h.record([], 4.0)[0]["event"] == "monitoring_recovered" and h.degraded == ""
