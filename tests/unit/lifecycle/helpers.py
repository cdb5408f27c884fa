"""Shared builders for lifecycle unit tests."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from router.clock import FakeClock
from router.config import FleetConfig, parse_fleet
from router.lifecycle.machine import LifecycleMachine
from router.scheduler import Scheduler

EXAMPLES = Path(__file__).resolve().parents[2] / "fixtures" / "peer_examples"
CONTRACT: dict[str, Any] = (
    json.loads((EXAMPLES / "attestation.json").read_text())["contract"]
    if (EXAMPLES / "attestation.json").exists()
    else {}
)


def fleet(n: int = 3, policy: str = "individual", contract: bool = False, **extra: Any) -> FleetConfig:
    data: dict[str, Any] = {
        "model": "fake",
        "engines": [
            {"iid": f"e{i}", "url": f"http://e{i}.test", "attestation_url": f"http://e{i}.test/att"}
            for i in range(n)
        ],
        "recovery": {"engine_restart_policy": policy},
        **extra,
    }
    if contract or policy == "whole_wave":
        data["engine_contract"] = dict(CONTRACT)
    return parse_fleet(data)


def machine(
    n: int = 3, policy: str = "individual", **kw: Any
) -> tuple[LifecycleMachine, Scheduler, FakeClock]:
    cfg = fleet(n, policy, **kw)
    sched = Scheduler.from_specs(cfg.engines)
    clock = FakeClock()
    counter = itertools.count(1)
    m = LifecycleMachine(cfg, sched, clock, wave_ids=lambda: f"wave-{next(counter):012x}")
    return m, sched, clock
