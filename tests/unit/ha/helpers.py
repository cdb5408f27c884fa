"""Builders for HA unit tests: a fleet, a core with a lifecycle machine, a fake clock."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from router.clock import FakeClock
from router.config import CONTRACT_FIELDS, FleetConfig, parse_fleet
from router.core import RouterCore
from router.journal import Journal
from router.lifecycle.machine import LifecycleMachine

FIXTURES = Path(__file__).parent / "fixtures"
CONTRACT: dict[str, Any] = {name: "x" for name in CONTRACT_FIELDS}


def fixture(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return doc


def fleet(
    n: int = 3,
    policy: str = "individual",
    contract: bool = False,
    pinned: tuple[str, ...] = (),
    model: str = "fake",
    state_path: str = "runs/state.json",
) -> FleetConfig:
    data: dict[str, Any] = {
        "model": model,
        "engines": [
            {
                "iid": f"e{i}",
                "url": f"http://e{i}.test",
                "role": "prefill" if i == 0 else "decode",
                "pin": f"e{i}" in pinned,
            }
            for i in range(n)
        ],
        "recovery": {"engine_restart_policy": policy, "state_path": state_path},
    }
    if contract or policy == "whole_wave":
        data["engine_contract"] = dict(CONTRACT)
    return parse_fleet(data)


def core(
    cfg: FleetConfig | None = None, clock: FakeClock | None = None, lifecycle: bool = True
) -> RouterCore:
    c = RouterCore(config=cfg or fleet(), journal=Journal(None), clock=clock or FakeClock())
    if lifecycle:
        c.extras["lifecycle"] = LifecycleMachine(c.config, c.scheduler, c.clock)
    return c


def machine(c: RouterCore) -> LifecycleMachine:
    m = c.extras["lifecycle"]
    assert isinstance(m, LifecycleMachine)
    return m
