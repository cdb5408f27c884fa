"""The process-bound ``narwhal.attestation`` v1 document: model, digests, build and verify (spec §6.6).

Pure: no I/O. ``canonical`` is the one serialisation every digest is computed over
(``json.dumps(sort_keys=True, separators=(",", ":"))``, UTF-8).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from router.engines.identity import same_process

SCHEMA = "narwhal.attestation"
SCHEMA_VERSION = 1
REQUIRED_KEYS: frozenset[str] = frozenset(
    {"schema", "schema_version", "contract", "sources", "engine", "attestation_digest"}
)
LAUNCH_KEYS: frozenset[str] = frozenset({"launch", "launch_digest"})


class AttestedEngine(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    version: str
    process_start_time_seconds: float


class AttestationDocument(BaseModel):
    """Shape of a ``narwhal.attestation`` v1 document (digests are checked by ``verify_attestation``)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)

    schema_: Literal["narwhal.attestation"] = Field(alias="schema")
    schema_version: Literal[1]
    contract: dict[str, Any]
    sources: dict[str, Any]
    engine: AttestedEngine
    launch: dict[str, Any] | None = None
    launch_digest: str | None = None
    attestation_digest: str

    @model_validator(mode="after")
    def _launch_pair(self) -> AttestationDocument:
        if (self.launch is None) != (self.launch_digest is None):
            raise ValueError("launch and launch_digest must appear together")
        return self


def canonical(obj: Any) -> bytes:
    """Canonical JSON bytes: sorted keys, no whitespace, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")


def digest(obj: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical(obj)).hexdigest()


def contract_fingerprint(contract: Mapping[str, Any]) -> str:
    """First 16 hex characters of sha256(canonical(contract)) (the readmission check label)."""
    return hashlib.sha256(canonical(dict(contract))).hexdigest()[:16]


def launch_digest(contract: Mapping[str, Any], launch: Any) -> str:
    return digest({"contract": dict(contract), "launch": launch})


def attestation_digest(doc: Mapping[str, Any]) -> str:
    return digest({k: v for k, v in doc.items() if k != "attestation_digest"})


def binding_digest(doc: Mapping[str, Any]) -> str:
    """The digest a profile binds to: ``launch_digest`` when present, else ``attestation_digest``."""
    value = doc.get("launch_digest") or doc.get("attestation_digest")
    return str(value or "")


def build_attestation(
    contract: Mapping[str, Any],
    sources: Mapping[str, str],
    version: str,
    process_start: float,
    launch: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A complete, self-consistent attestation document for one engine process."""
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "contract": dict(contract),
        "sources": dict(sources),
        "engine": {"version": version, "process_start_time_seconds": float(process_start)},
    }
    if launch is not None:
        doc["launch"] = dict(launch)
        doc["launch_digest"] = launch_digest(contract, doc["launch"])
    doc["attestation_digest"] = attestation_digest(doc)
    return doc


def _populated(value: Any) -> bool:
    return value is not None and value != ""


def _contract_failures(attested: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for key in sorted(set(attested) | set(expected)):
        if key not in attested:
            out.append(f"contract field {key} missing")
        elif key not in expected:
            out.append(f"contract field {key} not in the fleet engine_contract")
        elif canonical(attested[key]) != canonical(expected[key]):
            out.append(f"contract field {key} is {attested[key]!r}, expected {expected[key]!r}")
    return out


def verify_attestation(
    doc: Any, contract: Mapping[str, Any], live_version: str, live_process_start: float
) -> list[str]:
    """Failures of ``doc`` against the fleet contract and the live engine identity (empty = ok)."""
    if not isinstance(doc, dict):
        return ["document is not a JSON object"]
    keys = set(doc)
    missing = sorted(REQUIRED_KEYS - keys)
    unexpected = sorted(keys - REQUIRED_KEYS - LAUNCH_KEYS)
    failures: list[str] = []
    if missing:
        failures.append(f"missing keys: {', '.join(missing)}")
    if unexpected:
        failures.append(f"unexpected keys: {', '.join(unexpected)}")
    if len(keys & LAUNCH_KEYS) == 1:
        failures.append("launch and launch_digest must appear together")
    if failures:
        return failures
    try:
        parsed = AttestationDocument.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "document"
        return [f"invalid document: {where}: {err['msg']}"]

    if parsed.launch is not None and parsed.launch_digest != launch_digest(parsed.contract, parsed.launch):
        failures.append("launch_digest does not match contract and launch")
    if parsed.attestation_digest != attestation_digest(doc):
        failures.append("attestation_digest does not match the document")
    failures += _contract_failures(parsed.contract, contract)
    for key in sorted(parsed.contract):
        if not _populated(parsed.contract[key]):
            continue
        source = parsed.sources.get(key)
        if not isinstance(source, str) or not source:
            failures.append(f"no source for contract field {key}")
    if parsed.engine.version != live_version:
        failures.append(f"engine version {parsed.engine.version!r} differs from live {live_version!r}")
    start = parsed.engine.process_start_time_seconds
    if not (math.isfinite(start) and same_process(start, live_process_start)):
        failures.append(f"process start {start!r} differs from live {live_process_start!r}")
    return failures
