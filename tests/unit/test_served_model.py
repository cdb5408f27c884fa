"""The model check behind readiness: exclusion with the reason, lifted when the model is listed."""

from __future__ import annotations

from typing import Any

from router.clock import FakeClock
from router.config import parse_fleet
from router.core import RouterCore
from router.journal import Journal
from router.lifecycle.document import build_document
from router.lifecycle.machine import LifecycleMachine
from router.lifecycle.served_model import check_served_models


class Lister:
    def __init__(self) -> None:
        self.served: dict[str, Any] = {"e0": ["m"], "e1": ["x"]}

    async def models(self, iid: str) -> list[str]:
        value = self.served[iid]
        if isinstance(value, Exception):
            raise value
        return list(value)


async def test_exclusion_reason_is_visible_and_lifted() -> None:
    cfg = parse_fleet(
        {"model": "m", "engines": [{"iid": "e0", "url": "http://a"}, {"iid": "e1", "url": "http://b"}]}
    )
    clock = FakeClock()
    core = RouterCore(config=cfg, journal=Journal(None), clock=clock)
    rows: list[dict[str, Any]] = []
    lister = Lister()
    await check_served_models(lister, core.scheduler, "m", ["e0", "e1"], clock, rows.append)
    assert core.scheduler.excluded == {"e1": "serves ['x'], expected m"}
    assert [e.iid for e in core.scheduler.eligible()] == ["e0"]
    machine = LifecycleMachine(cfg, core.scheduler, clock)
    assert build_document(machine, core).engines["e1"].error == "serves ['x'], expected m"
    assert rows == [{"event": "engine_excluded", "at": clock.monotonic(), "iid": "e1",
                     "reason": "serves ['x'], expected m"}]  # fmt: skip

    lister.served["e0"] = ["x"]
    await check_served_models(lister, core.scheduler, "m", ["e0", "e1"], clock, rows.append)
    assert core.ready_reason() == (
        "engine identity validation pending"
        if not core.identities_ready
        else "no available engines (e0 serves ['x'], expected m; e1 serves ['x'], expected m)"
    )
    core.identities_ready = True
    assert (
        core.ready_reason()
        == "no available engines (e0 serves ['x'], expected m; e1 serves ['x'], expected m)"
    )

    lister.served = {"e0": ConnectionError("down"), "e1": ["m", "x"]}  # unreadable: left as it is
    await check_served_models(lister, core.scheduler, "m", ["e0", "e1"], clock, rows.append)
    assert core.scheduler.excluded == {"e0": "serves ['x'], expected m"}
    assert rows[-1] == {"event": "engine_exclusion_ended", "at": clock.monotonic(), "iid": "e1"}
    assert len(rows) == 3  # no repeated event for an unchanged verdict
