"""The membership record one active-active replica keeps under ``<prefix>replicas/<id>``.

``narwhal.replica`` v1, one strict pydantic model: the replica's id, the control URL operators and
the restart activities can reach it on, the lifecycle version (the holder's commit revision) it has
applied to its placement, and its resident prefill/decode counts per engine (engines with no
resident work are left out). The key lives on the replica's own short store lease: a replica that
dies stops counting when the key expires.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, field_validator

SCHEMA = "narwhal.replica"
SCHEMA_VERSION = 1


class MemberError(ValueError):
    """A membership record that must not be counted; the message says what is wrong."""


class ResidentWork(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    prefill: StrictInt = Field(default=0, ge=0)
    decode: StrictInt = Field(default=0, ge=0)

    @property
    def total(self) -> int:
        return self.prefill + self.decode


class MemberRecord(BaseModel):
    """``narwhal.replica`` v1 (the value of one membership key)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    schema_: Literal["narwhal.replica"] = Field(default="narwhal.replica", alias="schema")
    schema_version: Literal[1] = 1
    replica_id: StrictStr = Field(min_length=1)
    control_url: StrictStr = Field(description="where this replica's /narwhal/* API answers")
    applied_version: StrictInt = Field(ge=0, description="holder commit revision applied to placement")
    resident: dict[StrictStr, ResidentWork] = Field(
        default_factory=dict, description="engines with resident work on this replica"
    )
    updated_at: float = Field(description="wall-clock time of this update (Unix seconds)")

    @field_validator("updated_at", mode="before")
    @classmethod
    def _finite(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError("must be a finite number")
        return float(v)

    @field_validator("resident")
    @classmethod
    def _no_zero_rows(cls, v: dict[str, ResidentWork]) -> dict[str, ResidentWork]:
        return {iid: r for iid, r in sorted(v.items()) if r.total}

    def resident_on(self, iid: str) -> ResidentWork:
        return self.resident.get(iid, _ZERO)

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    def encode(self) -> bytes:
        return orjson.dumps(self.dump())

    def same_content(self, other: MemberRecord | None) -> bool:
        """Equal apart from ``updated_at`` (what the coalescer compares)."""
        return (
            other is not None
            and other.replica_id == self.replica_id
            and other.control_url == self.control_url
            and other.applied_version == self.applied_version
            and other.resident == self.resident
        )


_ZERO = ResidentWork()


def residents_from(counts: Mapping[str, tuple[int, int]]) -> dict[str, ResidentWork]:
    """``{iid: (prefill, decode)}`` → the record's ``resident`` map (zero rows dropped)."""
    return {iid: ResidentWork(prefill=p, decode=d) for iid, (p, d) in sorted(counts.items()) if p or d}


def decode_member(raw: bytes | str, key_id: str | None = None) -> MemberRecord:
    """Strict decode of a membership key's value; ``key_id`` (the key's last segment) must match."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise MemberError(f"membership record is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise MemberError("membership record must be a JSON object")
    if doc.get("schema") != SCHEMA:
        raise MemberError(f"membership record schema {doc.get('schema')!r} is not {SCHEMA!r}")
    if doc.get("schema_version") != SCHEMA_VERSION or isinstance(doc.get("schema_version"), bool):
        raise MemberError(f"membership record schema_version {doc.get('schema_version')!r} is not 1")
    try:
        rec = MemberRecord.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "record"
        raise MemberError(f"invalid membership record: {where}: {err['msg']}") from None
    if key_id is not None and rec.replica_id != key_id:
        raise MemberError(f"membership record of {rec.replica_id!r} stored under key {key_id!r}")
    return rec
