"""Builders for HA unit tests: a fleet, a core with a lifecycle machine, a fake clock."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router.clock import FakeClock
from router.config import CONTRACT_FIELDS, FleetConfig, parse_fleet
from router.core import RouterCore
from router.ha.transfer import Handover
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


@dataclass(eq=False)
class HACore(RouterCore):
    """A core with the lifecycle machine HA is given (``assemble`` gives it the LifecycleService)."""

    lifecycle: LifecycleMachine | None = None


def core(cfg: FleetConfig | None = None, clock: FakeClock | None = None, lifecycle: bool = True) -> HACore:
    c = HACore(config=cfg or fleet(), journal=Journal(None), clock=clock or FakeClock())
    if lifecycle:
        c.lifecycle = LifecycleMachine(c.config, c.scheduler, c.clock)
    return c


def machine(c: HACore) -> LifecycleMachine:
    assert c.lifecycle is not None
    return c.lifecycle


def handover(c: HACore) -> Handover:
    """``transfer.build`` / ``apply`` for this core, with its lifecycle machine (if any)."""
    return Handover(c, c.lifecycle)
