"""Fleet file loading: Narwhal 0.7.0 files accepted unchanged, unknown keys named with the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from router.config import CONTRACT_FIELDS, ConfigError, load_fleet, parse_fleet

PEER_FLEET = {
    "schema": "narwhal.fleet",
    "schema_version": 2,
    "model": "fake",
    "engines": [
        {"iid": "e0", "url": "http://127.0.0.1:9000/", "role": "prefill", "attestation_url": "http://a/att"},
        {"iid": "e1", "url": "http://127.0.0.1:9001", "role": "decode", "pin": True},
    ],
    "slo": {"ttft_s": 1.0, "tpot_s": 0.05},
    "profiles": {"path": "runs/profiles.json"},
    "engine": {"backend": "vllm", "tokenize": True, "health_timeout_s": 2.0},
    "serving": {"max_attempts": 3, "retry_base_s": 0.1, "admission": "predictive"},
    "recovery": {"state_path": "runs/state.json", "engine_restart_policy": "individual"},
    "controller": {"monitor_interval_s": 0.5, "thresholds": {"cooldown_s": 30}},
    "engine_contract": {
        "vllm_version": "0.11.0",
        **{f: "x" for f in CONTRACT_FIELDS if f != "engine_version"},
    },
}


def test_peer_fleet_file_accepted_and_unused_keys_reported(tmp_path: Path) -> None:
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(PEER_FLEET))
    cfg = load_fleet(path)
    assert cfg.engines[0].url == "http://127.0.0.1:9000"
    assert cfg.contract_complete and cfg.engine_contract is not None
    assert cfg.engine_contract["engine_version"] == "0.11.0"
    unused = cfg.unused_keys()
    for key in ("profiles", "engine.tokenize", "serving.admission", "controller.thresholds"):
        assert key in unused


def test_yaml_fleet(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("model: m\nengines:\n  - iid: e0\n    url: http://127.0.0.1:1\n")
    assert load_fleet(path).engine_ids == ["e0"]


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d.update(bogus=1), "unknown key 'bogus'"),
        (lambda d: d["engines"][0].update(colour="red"), "unknown key 'engines[0].colour'"),
        (lambda d: d["recovery"].update(nope=1), "unknown key recovery.nope"),
        (lambda d: d["serving"].update(turbo=True), "unknown key serving.turbo"),
        (lambda d: d["engine_contract"].update(flavour="x"), "unknown key engine_contract.flavour"),
        (lambda d: d.update(schema_version=3), "schema_version"),
        (lambda d: d["engines"].append(dict(d["engines"][0])), "duplicate engine iid(s): e0"),
    ],
)
def test_bad_fleet_files_name_key_and_file(mutate: object, needle: str, tmp_path: Path) -> None:
    doc = json.loads(json.dumps(PEER_FLEET))
    mutate(doc)  # type: ignore[operator]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as exc:
        load_fleet(path)
    assert str(path) in str(exc.value) and needle in str(exc.value)


def test_whole_wave_requires_complete_contract() -> None:
    doc = json.loads(json.dumps(PEER_FLEET))
    doc["recovery"]["engine_restart_policy"] = "whole_wave"
    del doc["engine_contract"]
    with pytest.raises(ConfigError, match="complete engine_contract"):
        parse_fleet(doc, "f.json")


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read fleet file"):
        load_fleet(tmp_path / "missing.json")
    bad = tmp_path / "torn.json"
    bad.write_text('{"model": ')
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_fleet(bad)
