"""The HA handoff document (`narwhal.handoff` v1, spec §2.1–2.2): one strict pydantic model.

``validate`` runs on every write, on load, on each standby poll and before apply. It rejects
(``HandoffError``) anything §2.2 rejects and, failing closed, also unknown keys, bools or strings
where numbers belong, and references to engines the document does not list. A document with the
right schema name but another version raises ``HandoffVersionError`` (fatal for a standby: the
peer speaks a contract this router does not).

Building the document from a live router and applying it to one live in ``router/ha/transfer.py``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, model_validator

from router.counters import HANDOFF_COUNTERS, REASON_OUTCOMES
from router.ha.demand_risk import DemandRiskDoc
from router.lifecycle.models import LifecycleSection

SCHEMA = "narwhal.handoff"
SCHEMA_VERSION = 1
SCHEMA_FILE = Path(__file__).resolve().parents[2] / "docs" / "schemas" / "narwhal.handoff.v1.json"


class HandoffError(ValueError):
    """A handoff document that must not be used; the message says what is wrong."""


class HandoffVersionError(HandoffError):
    """A ``narwhal.handoff`` document of a version this router does not speak."""


def _number(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"{name} must be a number")
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite")
    return float(v)


class Handoff(BaseModel):
    """``narwhal.handoff`` v1. Field order is the peer's wire order."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_: Literal["narwhal.handoff"] = Field(default="narwhal.handoff", alias="schema")
    schema_version: Literal[1] = 1
    at: float = Field(description="Wall-clock time the snapshot was built (Unix seconds)")
    run: StrictStr = Field(description="Journal run ID of the writing process")
    model: StrictStr
    epoch: StrictInt = Field(ge=0, description="Lease epoch; 0 without a lease")
    holder: StrictStr = Field(description="Lease holder token; empty without a lease")
    engines: list[StrictStr] = Field(description="Sorted configured engine IDs")
    roles: dict[StrictStr, Literal["prefill", "decode"]]
    ejected: list[StrictStr]
    inference_sources: dict[StrictStr, list[StrictStr]] = Field(default_factory=dict)
    counters: dict[StrictStr, StrictInt]
    outcome_reasons: dict[StrictStr, dict[StrictStr, StrictInt]] = Field(
        default_factory=lambda: {k: dict[str, int]() for k in REASON_OUTCOMES}
    )
    lifecycle: LifecycleSection
    demand_risk: DemandRiskDoc | None = None

    @model_validator(mode="before")
    @classmethod
    def _raw(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError("handoff must be a JSON object")
        if "at" in data:
            data = {**data, "at": _number("at", data["at"])}
        return data

    @model_validator(mode="after")
    def _coherent(self) -> Handoff:
        engines = set(self.engines)
        if len(engines) != len(self.engines):
            raise ValueError("engines has duplicate IDs")
        if any(not e for e in self.engines):
            raise ValueError("engines has an empty ID")
        for name, ids in (
            ("roles", self.roles),
            ("ejected", self.ejected),
            ("inference_sources", self.inference_sources),
            ("lifecycle.process_starts", self.lifecycle.process_starts),
        ):
            unknown = sorted(set(ids) - engines)
            if unknown:
                raise ValueError(f"{name} names engines not in engines: {unknown}")
        if len(set(self.ejected)) != len(self.ejected):
            raise ValueError("ejected has duplicate IDs")
        for iid, producers in self.inference_sources.items():
            if not producers:
                raise ValueError(f"inference_sources.{iid} must be a non-empty list")
            bad = [p for p in producers if p and p not in engines]
            if bad:
                raise ValueError(f"inference_sources.{iid} names unknown producers {bad}")
        for key, n in self.counters.items():
            if key not in HANDOFF_COUNTERS:
                raise ValueError(f"counters.{key} is not a handoff counter")
            if n < 0:
                raise ValueError(f"counters.{key} must be >= 0")
        for outcome, reasons in self.outcome_reasons.items():
            if outcome not in REASON_OUTCOMES:
                raise ValueError(f"outcome_reasons.{outcome} is not a reason-bearing outcome")
            for reason, n in reasons.items():
                if n < 0:
                    raise ValueError(f"outcome_reasons.{outcome}.{reason} must be >= 0")
        return self

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    def counter(self, key: str) -> int:
        return self.counters.get(key, 0)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


def validate(doc: Any) -> Handoff:
    """Strict §2.2 validation of a decoded document (or a model, re-checked)."""
    if isinstance(doc, Handoff):
        doc = doc.dump()
    if not isinstance(doc, dict):
        raise HandoffError("handoff must be a JSON object")
    if doc.get("schema") != SCHEMA:
        raise HandoffError(f"handoff schema {doc.get('schema')!r} is not {SCHEMA!r}")
    version = doc.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise HandoffError("handoff schema_version must be an integer")
    if version != SCHEMA_VERSION:
        raise HandoffVersionError(f"handoff schema_version {version} is not supported (this router reads 1)")
    try:
        return Handoff.model_validate(doc)
    except ValidationError as exc:
        raise HandoffError(f"invalid handoff: {_first_error(exc)}") from None


def loads(raw: bytes | str) -> Handoff:
    """Decode and validate; undecodable input raises ``HandoffError`` too."""
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise HandoffError(f"handoff is not valid JSON: {exc}") from None
    return validate(doc)


def json_schema() -> dict[str, Any]:
    """The published JSON Schema (``docs/schemas/narwhal.handoff.v1.json``)."""
    schema = Handoff.model_json_schema(by_alias=True, mode="validation")
    schema["$id"] = "https://narwhal.invalid/schemas/narwhal.handoff.v1.json"
    schema["title"] = "narwhal.handoff v1"
    return schema


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
