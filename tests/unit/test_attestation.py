"""``narwhal.attestation`` v1: canonical digests, build, and the §6.6 verification rules."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.contract import DEFAULT_CONTRACT, sources_for
from router.attestation import (
    build_attestation,
    canonical,
    contract_fingerprint,
    digest,
    verify_attestation,
)
from router.config import CONTRACT_FIELDS

EXAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "peer_examples" / "attestation.json"
FIXTURE: dict[str, Any] = {
    "schema": "narwhal.attestation",
    "schema_version": 1,
    "contract": {
        "engine_version": "0.0.0-fake",
        "image_digest": "sha256:" + "a" * 64,
        "transfer_version": "fake",
        "connector_version": 1,
        "model_architecture": "FakeForCausalLM",
        "model_dtype": "float32",
        "kv_heads": 1,
        "head_size": 1,
        "hidden_layers": 1,
        "attention_backend": "FAKE",
        "kv_cache_dtype": "auto",
        "cross_layers_blocks": False,
        "hybrid_kv_cache_manager": False,
        "connector": "NixlConnector",
        "kv_role": "kv_both",
        "transfer_mode": "pull",
        "speculative_config": "disabled",
        "enforce_handshake_compat": True,
    },
    "engine": {"version": "0.0.0-fake", "process_start_time_seconds": 1795970414.6156673},
    "launch": {"args": ["--max-num-seqs", "64"]},
    "launch_digest": "sha256:52d9864c9c22467fb67305af2261440290475182b14981519ba9d46b7602e675",
    "attestation_digest": "sha256:ddb7b25de74f51af4d386f6be08ccfe153cf6924af3a3abd8cb2b8cdeabd61be",
}
FIXTURE["sources"] = {k: f"fake:{k}" for k in sorted(FIXTURE["contract"])}


@pytest.fixture
def example() -> dict[str, Any]:
    if EXAMPLE.exists():
        doc: dict[str, Any] = json.loads(EXAMPLE.read_text())
        return doc
    return copy.deepcopy(FIXTURE)


def _verify(
    doc: Any, contract: dict[str, Any] | None = None, version: str = "", start: float = 0.0
) -> list[str]:
    return verify_attestation(
        doc,
        contract if contract is not None else doc["contract"],
        version or doc["engine"]["version"],
        start or doc["engine"]["process_start_time_seconds"],
    )


def test_example_document_verifies(example: dict[str, Any]) -> None:
    contract = dict(example["contract"])
    assert verify_attestation(example, contract, "0.0.0-fake", 1795970414.6156673) == []
    assert contract_fingerprint(contract) == "c67583d9d8359157"  # the spec's observed check label


def test_canonical_form() -> None:
    assert canonical({"b": 1, "a": [1, 2], "c": "é"}) == b'{"a":[1,2],"b":1,"c":"\\u00e9"}'
    assert digest({}) == "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"


def test_build_roundtrip_with_and_without_launch() -> None:
    sources = sources_for(DEFAULT_CONTRACT)
    plain = build_attestation(DEFAULT_CONTRACT, sources, "0.11.0", 1700000000.25)
    assert set(plain) == {"schema", "schema_version", "contract", "sources", "engine", "attestation_digest"}
    assert verify_attestation(plain, DEFAULT_CONTRACT, "0.11.0", 1700000000.25) == []
    launched = build_attestation(DEFAULT_CONTRACT, sources, "0.11.0", 1700000000.25, launch={"args": ["-x"]})
    assert launched["launch_digest"] == digest({"contract": DEFAULT_CONTRACT, "launch": {"args": ["-x"]}})
    assert verify_attestation(launched, DEFAULT_CONTRACT, "0.11.0", 1700000000.25) == []


def test_live_identity_mismatches(example: dict[str, Any]) -> None:
    start = example["engine"]["process_start_time_seconds"]
    assert _verify(example, start=start + 5e-7) == []
    [failure] = _verify(example, start=start + 1.0)
    assert failure.startswith("process start")
    [failure] = _verify(example, version="0.0.1")
    assert failure.startswith("engine version")


def test_contract_must_equal_the_fleet_contract(example: dict[str, Any]) -> None:
    fleet = {**example["contract"], "kv_heads": 2}
    assert _verify(example, contract=fleet) == ["contract field kv_heads is 1, expected 2"]
    fleet = {**example["contract"], "connector_version": True}  # bool is not the integer 1
    assert _verify(example, contract=fleet) == ["contract field connector_version is 1, expected True"]
    fleet = {k: v for k, v in example["contract"].items() if k != "kv_role"}
    assert _verify(example, contract=fleet) == ["contract field kv_role not in the fleet engine_contract"]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d.update(extra=1), "unexpected keys: extra"),
        (lambda d: d.pop("sources"), "missing keys: sources"),
        (lambda d: d.pop("launch_digest"), "launch and launch_digest must appear together"),
        (lambda d: d.update(schema="other"), "invalid document: schema"),
        (lambda d: d.update(schema_version=2), "invalid document: schema_version"),
        (lambda d: d["launch"]["args"].append("--x"), "launch_digest does not match"),
        (lambda d: d.update(attestation_digest="sha256:00"), "attestation_digest does not match"),
        (lambda d: d["sources"].pop("kv_heads"), "no source for contract field kv_heads"),
        (lambda d: d["sources"].update(kv_heads=""), "no source for contract field kv_heads"),
    ],
)
def test_tampered_documents_are_rejected(example: dict[str, Any], mutate: Any, expected: str) -> None:
    contract = dict(example["contract"])
    doc = copy.deepcopy(example)
    mutate(doc)
    failures = _verify(doc, contract=contract, version="0.0.0-fake", start=1795970414.6156673)
    assert any(f.startswith(expected) for f in failures), failures


def test_tampered_contract_breaks_digest_and_equality(example: dict[str, Any]) -> None:
    contract = dict(example["contract"])
    doc = copy.deepcopy(example)
    doc["contract"]["engine_version"] = "tampered"
    failures = _verify(doc, contract=contract)
    assert "launch_digest does not match contract and launch" in failures
    assert "attestation_digest does not match the document" in failures
    assert "contract field engine_version is 'tampered', expected '0.0.0-fake'" in failures


def test_not_an_object() -> None:
    assert verify_attestation([], {}, "v", 1.0) == ["document is not a JSON object"]


_json_scalars = st.one_of(st.integers(-(10**6), 10**6), st.booleans(), st.text(max_size=8), st.none())


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(_json_scalars, min_size=len(CONTRACT_FIELDS), max_size=len(CONTRACT_FIELDS)),
    field=st.sampled_from(CONTRACT_FIELDS),
    replacement=_json_scalars,
    start=st.floats(min_value=1.0, max_value=4e9),
)
def test_any_contract_change_is_detected(
    values: list[Any], field: str, replacement: Any, start: float
) -> None:
    contract = dict(zip(CONTRACT_FIELDS, values, strict=True))
    doc = build_attestation(contract, sources_for(contract), "1.0", start, launch={"args": []})
    assert verify_attestation(doc, contract, "1.0", start) == []
    tampered = copy.deepcopy(doc)
    tampered["contract"][field] = replacement
    changed = canonical(replacement) != canonical(contract[field])
    assert bool(verify_attestation(tampered, contract, "1.0", start)) == changed
    # the fleet side changing is caught even with a pristine document
    assert bool(verify_attestation(doc, {**contract, field: replacement}, "1.0", start)) == changed
