"""The ``narwhal.lifecycle`` v1 document (spec §4.1) and the lifecycle request bodies (§5.1, §6.1).

One pydantic model per wire shape; ``docs/schemas/narwhal.lifecycle.v1.json`` is generated from
``LifecycleDocument`` (``python -m router.lifecycle.document``) and pinned by a test.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError, field_validator

from router.builds import BuildView
from router.core import RouterCore
from router.lifecycle.machine import LifecycleMachine
from router.lifecycle.models import DrainRecord, LifecycleState
from router.replicas.view import ReplicaPicture, ReplicasSection

SCHEMA = "narwhal.lifecycle"
SCHEMA_VERSION = 1
M = TypeVar("M", bound=BaseModel)
SCHEMA_PATH = Path(__file__).resolve().parents[2] / "docs" / "schemas" / "narwhal.lifecycle.v1.json"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RouterView(_Strict):
    controls_fleet: bool
    ready: bool


class WaveView(_Strict):
    id: str = Field(description="current wave ID `wave-<12 hex>`, or empty")
    active: bool = Field(description="a wave exists: router-wide readiness is withdrawn")
    ready_to_stop: bool = Field(description="every wave member is drained (safe for the supervisor)")


class Resident(_Strict):
    prefill: int = Field(ge=0)
    decode: int = Field(ge=0)


class EngineView(_Strict):
    state: LifecycleState
    draining: bool
    accepts_new: bool
    ready_to_stop: bool
    resident: Resident
    deadline_at: float | None
    restart_required: bool
    wave_id: str
    old_process_start: float | None
    new_process_start: float | None
    checks: list[str]
    error: str
    # additive: the build identity last read from the engine (router/builds.py); absent until read
    build: BuildView | None = None


class LifecycleEvent(BaseModel):
    model_config = ConfigDict(extra="allow")
    event: Literal["engine_lifecycle"]
    action: str
    at: float


class LifecycleDocument(_Strict):
    schema_: Literal["narwhal.lifecycle"] = Field(default="narwhal.lifecycle", alias="schema")
    schema_version: Literal[1] = 1
    router: RouterView
    wave: WaveView
    engines: dict[str, EngineView]
    events: list[LifecycleEvent]
    engine_restart_policy: Literal["individual", "whole_wave"]
    process_starts: dict[str, float]
    error: str = ""
    # additive, active-active mode only (absent otherwise: the peer's document, unchanged)
    replicas: ReplicasSection | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True, title="narwhal.lifecycle v1")

    def to_json(self) -> dict[str, Any]:
        exclude = {"replicas"} if self.replicas is None else None
        doc = self.model_dump(mode="json", by_alias=True, exclude=exclude)
        for entry in doc["engines"].values():  # additive fields absent until known: the peer's shape
            if entry.get("build") is None:
                entry.pop("build", None)
        return doc


def engine_view(
    machine: LifecycleMachine, core: RouterCore, iid: str, picture: ReplicaPicture | None = None
) -> EngineView:
    sched = core.scheduler
    runtime = sched.engines[iid]
    rec = machine.records.get(iid)
    if picture is not None:  # active-active: resident work on this engine summed over every replica
        total = picture.resident(iid)
        resident = Resident(prefill=total.prefill, decode=total.decode)
    else:
        resident = Resident(prefill=runtime.resident_prefill, decode=runtime.resident_decode)
    return EngineView(
        state=rec.state if rec is not None else "active",
        draining=iid in sched.draining,
        accepts_new=sched.accepts_new(iid),
        ready_to_stop=machine.ready_to_stop(iid),
        resident=resident,
        deadline_at=rec.deadline_at if rec is not None else None,
        restart_required=rec.restart_required if rec is not None else False,
        wave_id=rec.wave_id if rec is not None else "",
        old_process_start=rec.old_process_start if rec is not None else None,
        new_process_start=rec.new_process_start if rec is not None else None,
        checks=list(rec.checks) if rec is not None else [],
        error=_error(rec, sched.excluded.get(iid, "")),
        build=core.engine_builds.view(iid),
    )


def _error(rec: DrainRecord | None, excluded: str) -> str:
    """The record's error; for an engine without a hold, why it is excluded from placement."""
    if rec is not None and (rec.state != "active" or rec.error):
        return rec.error
    return excluded


def build_document(
    machine: LifecycleMachine, core: RouterCore, error: str = "", picture: ReplicaPicture | None = None
) -> LifecycleDocument:
    machine.refresh()
    return LifecycleDocument(
        router=RouterView(controls_fleet=core.controls_fleet(), ready=core.ready()),
        wave=WaveView(
            id=machine.wave_id, active=bool(machine.wave_id), ready_to_stop=machine.wave_ready_to_stop()
        ),
        engines={iid: engine_view(machine, core, iid, picture) for iid in sorted(core.scheduler.engines)},
        events=[LifecycleEvent.model_validate(e) for e in machine.events],
        engine_restart_policy=machine.policy,
        process_starts=dict(sorted(machine.process_starts.items())),
        error=error,
        replicas=picture.section() if picture is not None else None,
    )


# -- request bodies ---------------------------------------------------------------------------
def _no_duplicates(engines: list[str]) -> list[str]:
    """A request naming an engine twice is malformed (422), not silently de-duplicated."""
    twice = sorted({iid for iid in engines if engines.count(iid) > 1})
    if twice:
        raise ValueError(f"duplicate engine ID(s): {', '.join(twice)}")
    return engines


# What the body checks refuse (422) is in the request schemas too, so a body valid by the OpenAPI
# document is never a 422: no engine named twice; ``deadline_s`` a JSON number that is a finite
# double (a larger literal is not one: "request body is not valid JSON"). A ``deadline_s`` that is
# not positive, an unknown engine or a shape the fleet forbids is the lifecycle's 409 (spec §5.2).
_UNIQUE: dict[str, Any] = {"uniqueItems": True}
_FINITE: dict[str, Any] = {"minimum": -sys.float_info.max, "maximum": sys.float_info.max}


class DrainRequest(_Strict):
    """``POST /narwhal/lifecycle/drain``; ``wave: true`` with no engines means every engine."""

    engines: list[StrictStr] = Field(
        default_factory=list, description="engine IDs to drain", json_schema_extra=_UNIQUE
    )
    wave: StrictBool = Field(default=False, description="drain the whole fleet as one wave")
    deadline_s: float = Field(
        default=300.0,
        description="seconds until the drain deadline (> 0, else 409 'deadline_s must be positive')",
        json_schema_extra=_FINITE,
    )

    _unique = field_validator("engines")(_no_duplicates)

    @field_validator("deadline_s", mode="before")
    @classmethod
    def _finite(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError("must be a number")
        if not math.isfinite(v):
            raise ValueError("must be finite")
        return v


class ReadmitRequest(_Strict):
    """``POST /narwhal/lifecycle/readmit``; ``wave: true`` with no engines means the whole wave."""

    engines: list[StrictStr] = Field(
        default_factory=list, description="engine IDs to validate", json_schema_extra=_UNIQUE
    )
    wave: StrictBool = Field(default=False, description="validate and readmit the active wave")

    _unique = field_validator("engines")(_no_duplicates)


class RequestError(ValueError):
    """A request body of the wrong shape (HTTP 422); the message names the field."""


def parse_request(model: type[M], body: Any) -> M:
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "body"
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        raise RequestError(f"invalid request: {where}: {msg}") from None


def document_schema() -> dict[str, Any]:
    schema = LifecycleDocument.model_json_schema(by_alias=True, mode="serialization")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "narwhal.lifecycle.v1.json"
    return schema


def schema_text() -> str:
    return json.dumps(document_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":  # regenerate the pinned schema
    SCHEMA_PATH.parent.mkdir(parents=True, exist_ok=True)
    SCHEMA_PATH.write_text(schema_text(), encoding="utf-8")
    sys.stdout.write(f"wrote {SCHEMA_PATH}\n")
