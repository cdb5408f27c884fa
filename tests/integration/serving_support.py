"""Shared helpers for the serving integration tests: contract-free fleets with fast timeouts."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.fleet import SimEngine, write_fleet
from tests.support.router import RouterHandle
from tests.support.waits import wait_for

FAST: dict[str, Any] = {
    "engine": {"first_token_timeout_s": 1.0, "decode_read_timeout_s": 1.0, "health_timeout_s": 0.5},
    "serving": {"prefill_timeout_s": 1.0, "max_request_bytes": 8192, "request_timeout_s": 30.0},
    "controller": {"monitor_interval_s": 0.1},
    "recovery": {"readmit_every": 3, "eject_after": 3, "liveness_every": 0},
}


def contract_free_fleet(tmp_path: Path, sims: list[SimEngine], **serving: Any) -> Path:
    """A fleet without ``engine_contract``: the breaker's own health readmission applies."""
    extra = json.loads(json.dumps(FAST))
    extra["serving"].update(serving)
    path = write_fleet(tmp_path, sims, extra=extra)
    doc = json.loads(path.read_text())
    doc.pop("engine_contract", None)
    for e in doc["engines"]:
        e.pop("attestation_url", None)
    path.write_text(json.dumps(doc, indent=2))
    return path


def wait_until(check: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    return wait_for(what, check, timeout=timeout)


def terminal_sum(m: dict[str, float]) -> float:
    keys = ["narwhal_served_total", "narwhal_cancelled_total", "narwhal_invalid_requests_total"]
    total = sum(m.get(k, 0.0) for k in keys)
    prefixes = (
        "narwhal_failed_total{",
        "narwhal_rejected_total{",
        "narwhal_expired_total{",
        "narwhal_refused_total{",
    )
    return total + sum(v for k, v in m.items() if k.startswith(prefixes))


def settled_rows(router: RouterHandle) -> list[dict[str, Any]]:
    """The request rows of the journal once every offered request has its row (the journal's writer
    thread gets rows in batches; the counters are updated first)."""
    m = wait_until(lambda: (mm := router.metrics())["narwhal_inflight_requests"] == 0 and mm, what="idle")
    rows: list[dict[str, Any]] = wait_until(
        lambda: (
            len(rr := [r for r in router.journal_rows() if "rid" in r]) == m["narwhal_offered_total"] and rr
        ),
        what="one journal row per offered request",
    )
    return rows
