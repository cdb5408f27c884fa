"""Lifecycle records as persisted in the handoff's ``lifecycle`` section (spec §2.1, §2.4 step 6).

Shared by the lifecycle state machine (which owns them) and the HA handoff (which carries them).
Strict: unknown keys, bools where numbers belong and non-finite times are rejected.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, field_validator

LifecycleState = Literal["active", "draining", "drained", "deadline_exceeded", "validating", "blocked"]
LIFECYCLE_STATES: tuple[str, ...] = (
    "active",
    "draining",
    "drained",
    "deadline_exceeded",
    "validating",
    "blocked",
)
MAX_EVENTS = 200


def _finite_number(v: Any, *, allow_none: bool) -> Any:
    if v is None and allow_none:
        return v
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError("must be a number")
    if not math.isfinite(v):
        raise ValueError("must be finite")
    return float(v)


class DrainRecord(BaseModel):
    """One engine's last lifecycle action (records persist after readmission as history)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    iid: StrictStr = Field(min_length=1)
    state: LifecycleState
    requested_at: float
    deadline_at: float
    restart_required: StrictBool
    wave_id: StrictStr = ""
    old_process_start: float | None = None
    new_process_start: float | None = None
    error: StrictStr = ""
    checks: list[StrictStr] = Field(default_factory=list)

    @field_validator("requested_at", "deadline_at", mode="before")
    @classmethod
    def _times(cls, v: Any) -> Any:
        return _finite_number(v, allow_none=False)

    @field_validator("old_process_start", "new_process_start", mode="before")
    @classmethod
    def _starts(cls, v: Any) -> Any:
        return _finite_number(v, allow_none=True)


class LifecycleSection(BaseModel):
    """The handoff's ``lifecycle`` object: what a replacement router restores."""

    model_config = ConfigDict(extra="forbid")

    wave_id: StrictStr = ""
    records: list[DrainRecord] = Field(default_factory=list)
    events: list[dict[str, Any]] = Field(default_factory=list)
    engine_restart_policy: Literal["individual", "whole_wave"] = "individual"
    process_starts: dict[str, float] = Field(default_factory=dict)

    @field_validator("events", mode="before")
    @classmethod
    def _events(cls, v: Any) -> Any:
        return [] if v is None else v

    @field_validator("process_starts", mode="before")
    @classmethod
    def _process_starts(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            raise ValueError("process_starts must be an object")
        for key, value in v.items():
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ValueError(f"process_starts.{key} must be a finite positive number")
        return v
