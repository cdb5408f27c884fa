"""Consolidation-risk events (spec §9.3): latest kind, its monotonic time, per-kind counts.

Pure: the caller passes nothing but the kind; time comes from the injected clock. The handoff
carries ``{"kind", "age_s", "events"}``; a receiver re-anchors the age on its own monotonic clock
and adds the counts to its own. Arrival evidence is not transferred.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator

from router.clock import Clock

FIRST_TOKEN_TIMEOUT = "first_token_timeout"
P_TO_D_RECOVERY = "p_to_d_recovery"
RISK_KINDS: tuple[str, ...] = (FIRST_TOKEN_TIMEOUT, P_TO_D_RECOVERY)


class DemandRiskDoc(BaseModel):
    """The handoff's ``demand_risk`` object."""

    model_config = ConfigDict(extra="forbid")

    kind: StrictStr
    age_s: float = 0.0
    events: dict[StrictStr, StrictInt] = Field(default_factory=dict)

    @field_validator("age_s", mode="before")
    @classmethod
    def _age(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError("age_s must be a number")
        if not math.isfinite(v) or v < 0:
            raise ValueError("age_s must be finite and >= 0")
        return float(v)

    @field_validator("events")
    @classmethod
    def _counts(cls, v: dict[str, int]) -> dict[str, int]:
        for kind, n in v.items():
            if n < 0:
                raise ValueError(f"events.{kind} must be >= 0")
        return v


class DemandRisk:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.kind = ""
        self.since: float | None = None  # monotonic time of the latest event
        self.counts: dict[str, int] = {}

    def record(self, kind: str) -> None:
        """A consolidation-risk event happened now (e.g. a decode leg got no first token)."""
        if not kind:
            raise ValueError("demand risk kind must not be empty")
        self.kind = kind
        self.since = self.clock.monotonic()
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def age_s(self) -> float | None:
        return None if self.since is None else max(0.0, self.clock.monotonic() - self.since)

    def snapshot(self) -> DemandRiskDoc | None:
        age = self.age_s()
        if age is None:
            return None
        return DemandRiskDoc(
            kind=self.kind, age_s=age, events={k: n for k, n in sorted(self.counts.items()) if n}
        )

    def rearm(self, doc: DemandRiskDoc | None) -> None:
        """Take over a peer's latest event: age re-anchored here, counts added to ours."""
        if doc is None:
            return
        since = self.clock.monotonic() - doc.age_s
        if self.since is None or since >= self.since:
            self.kind, self.since = doc.kind, since
        for kind, n in doc.events.items():
            if n > 0:
                self.counts[kind] = self.counts.get(kind, 0) + n
