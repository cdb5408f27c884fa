"""The monitor's periodic handoff write (``HAService.write_handoff``): written when the state
changed, skipped while only the snapshot time and the counters moved — for at most
``persist.REFRESH_S`` — and never skipped while the last write failed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from router.clock import FakeClock
from router.ha.persist import REFRESH_S
from router.ha.service import HAService
from router.ha.settings import HARuntime
from tests.unit.ha.helpers import HACore, core


def _service(tmp_path: Path, c: HACore) -> HAService:
    runtime = HARuntime(state_path=str(tmp_path / "a.state.json"), lease_path="", router_id="router-a")
    return HAService(c, runtime, lifecycle=c.lifecycle)


def _on_disk(ha: HAService) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(Path(ha.settings.state_path).read_text())
    return doc


def _block(state: Path) -> None:
    state.unlink()
    state.mkdir()  # a directory where the state file goes: every write of it fails


def _unblock(state: Path) -> None:
    if state.is_dir():
        state.rmdir()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def test_a_pass_that_changed_only_the_counters_writes_them_within_the_refresh_period(
    tmp_path: Path, clock: FakeClock
) -> None:
    c = core(clock=clock)
    ha = _service(tmp_path, c)
    await ha.start()
    await ha.write_handoff()  # start-up wrote it: nothing changed since
    assert ha.persister.skipped == 1
    first = _on_disk(ha)
    c.counters.finish("served")
    clock.advance(1.0)
    clock.jump_wall(1.0)
    await ha.write_handoff()  # only the counters and `at` changed: not written yet
    assert _on_disk(ha) == first and ha.persister.skipped == 2
    assert ha.handover.build().counters["served"] == 1  # the live document has it
    clock.advance(REFRESH_S)
    await ha.write_handoff()
    again = _on_disk(ha)
    assert again["counters"]["served"] == 1 and again["at"] > first["at"]
    await ha.stop()


async def test_a_pass_after_a_state_change_writes_it_at_once(tmp_path: Path, clock: FakeClock) -> None:
    c = core(clock=clock)
    ha = _service(tmp_path, c)
    await ha.start()
    await ha.write_handoff()
    c.scheduler.eject("e1", "liveness")  # not a lifecycle mutation: no write of its own
    clock.advance(0.5)
    await ha.write_handoff()
    assert _on_disk(ha)["ejected"] == ["e1"] and ha.persister.skipped == 1  # only the first pass
    await ha.stop()


async def test_after_a_failed_write_every_pass_writes_until_one_lands(
    tmp_path: Path, clock: FakeClock
) -> None:
    c = core(clock=clock)
    ha = _service(tmp_path, c)
    await ha.start()
    await ha.write_handoff()
    state = Path(ha.settings.state_path)
    _block(state)
    try:
        clock.advance(0.5)
        await ha.write_handoff()
        assert ha.persister.skipped == 2  # nothing changed and the last write landed: skipped
        c.scheduler.eject("e1", "liveness")
        await ha.write_handoff()
        assert c.persist_degraded.startswith("state not persisted: ")
        failures = ha.persister.failures
        clock.advance(0.5)
        await ha.write_handoff()  # nothing changed since, but the last write failed: tried again
        assert ha.persister.failures == failures + 1 and ha.persister.skipped == 2
    finally:
        _unblock(state)
    clock.advance(0.5)
    await ha.write_handoff()  # the fault cleared: the next pass lands and says so
    assert c.persist_degraded == "" and _on_disk(ha)["ejected"] == ["e1"]
    await ha.stop()
