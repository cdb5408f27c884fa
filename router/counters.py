"""Request outcome counters (spec §8): every request ends in exactly one terminal outcome."""

from __future__ import annotations

from collections import defaultdict
from typing import Literal

Outcome = Literal["served", "failed", "refused", "rejected", "cancelled", "expired", "invalid_requests"]
OUTCOMES: tuple[Outcome, ...] = (
    "served",
    "failed",
    "refused",
    "rejected",
    "cancelled",
    "expired",
    "invalid_requests",
)
# Counter keys in the handoff document (spec §2.1), in the peer's order.
HANDOFF_COUNTERS: tuple[str, ...] = (
    "offered",
    "unsized_offered",
    "served",
    "slo_met",
    "expired",
    "invalid_requests",
    "failed",
    "refused",
    "rejected",
    "cancelled",
    "unserved",
)
REASON_OUTCOMES: tuple[str, ...] = ("failed", "rejected", "expired", "refused")
FAILED_REASONS: tuple[str, ...] = (
    "no_engine",
    "engine_unreachable",
    "engine_connection",
    "engine_timeout",
    "engine_overloaded",
    "engine_rejected",
    "engine_error",
    "local_pool",
    "invalid_response",
    "response_limit",
    "internal",
)
REJECTED_REASONS: tuple[str, ...] = ("inflight_limit", "saturated", "not_ready")
EXPIRED_REASONS: tuple[str, ...] = ("deadline", "queue_timeout", "handoff")


class Counters:
    def __init__(self) -> None:
        self.values: dict[str, int] = dict.fromkeys(HANDOFF_COUNTERS, 0)
        self.reasons: dict[str, dict[str, int]] = {k: defaultdict(int) for k in REASON_OUTCOMES}
        self.invalid_reasons: dict[str, int] = defaultdict(int)

    def offer(self) -> None:
        self.values["offered"] += 1

    def finish(self, outcome: Outcome, reason: str = "") -> None:
        self.values[outcome] += 1
        if outcome in self.reasons:
            self.reasons[outcome][reason or "unclassified"] += 1
        elif outcome == "invalid_requests" and reason:
            self.invalid_reasons[reason] += 1

    def terminal_total(self) -> int:
        return sum(self.values[o] for o in OUTCOMES)

    def snapshot(self) -> dict[str, int]:
        return dict(self.values)

    def outcome_reasons(self) -> dict[str, dict[str, int]]:
        return {k: {r: n for r, n in sorted(v.items()) if n} for k, v in self.reasons.items()}

    def restore(self, counters: dict[str, int], reasons: dict[str, dict[str, int]] | None) -> None:
        for key in HANDOFF_COUNTERS:
            self.values[key] = int(counters.get(key, 0))
        for outcome in REASON_OUTCOMES:
            restored = dict((reasons or {}).get(outcome, {}))
            shortfall = self.values[outcome] - sum(restored.values())
            if shortfall > 0:
                restored["unclassified"] = restored.get("unclassified", 0) + shortfall
            self.reasons[outcome] = defaultdict(int, restored)
