"""Fleet builders: generated fleet files parse, commands and supervisor configs are well-formed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fleet.contract import DEFAULT_CONTRACT
from fleet.engine_sim import parse_args
from fleet.fleetgen import fleet_document, sim_command, supervisor_config
from fleet.managed import SupervisorConfig, parse_process_start
from router.config import CONTRACT_FIELDS, ConfigError, parse_fleet

ENGINES = [("e0", "http://127.0.0.1:9001/", "prefill"), ("e1", "http://127.0.0.1:9002", "decode")]


def test_default_contract_is_complete() -> None:
    assert set(DEFAULT_CONTRACT) == set(CONTRACT_FIELDS)
    assert DEFAULT_CONTRACT["connector"] == "NixlConnector"


@pytest.mark.parametrize("policy", ["individual", "whole_wave"])
def test_fleet_document_parses(policy: str, tmp_path: Path) -> None:
    doc = fleet_document(ENGINES, "sim-model", policy=policy, state_path=tmp_path / "s.json")
    cfg = parse_fleet(doc)
    assert cfg.contract_complete
    assert cfg.engine_contract == DEFAULT_CONTRACT
    assert cfg.recovery.engine_restart_policy == policy
    assert cfg.recovery.state_path == str(tmp_path / "s.json")
    e0 = cfg.engine_by_id("e0")
    assert (e0.url, e0.role, e0.attestation_url) == (
        "http://127.0.0.1:9001",
        "prefill",
        "http://127.0.0.1:9001/v1/attestation",
    )


def test_fleet_document_extra_is_deep_merged() -> None:
    doc = fleet_document(
        ENGINES, "m", extra={"recovery": {"eject_after": 1}, "controller": {"min_decode": 0}}
    )
    cfg = parse_fleet(doc)
    assert cfg.recovery.eject_after == 1
    assert cfg.recovery.engine_restart_policy == "individual"
    assert cfg.controller.min_decode == 0
    with pytest.raises(ConfigError, match="unknown key"):
        parse_fleet(fleet_document(ENGINES, "m", extra={"bogus": 1}))


def test_sim_command_flags_roundtrip() -> None:
    cmd = sim_command("e3", 9100, "m", itl_ms=1.5, kv_layout="nixl-v2", seed=None)
    assert Path(cmd[0]) == Path(sys.executable).parent / "narwhal-engine-sim"
    cfg = parse_args(cmd[1:])
    assert (cfg.iid, cfg.port, cfg.model, cfg.itl_ms, cfg.kv_layout) == ("e3", 9100, "m", 1.5, "nixl-v2")
    assert cfg.contract == DEFAULT_CONTRACT


def test_supervisor_config_validates() -> None:
    raw = supervisor_config([("e0", 9001), ("e1", 9002)], model="m", health_timeout_s=5)
    cfg = SupervisorConfig.model_validate(raw)
    assert [e.iid for e in cfg.engines] == ["e0", "e1"]
    assert cfg.engines[1].url == "http://127.0.0.1:9002"
    assert "--port" in cfg.engines[1].command and "9002" in cfg.engines[1].command


def test_parse_process_start() -> None:
    text = "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1795970414.6156673\n"
    assert parse_process_start(text) == 1795970414.6156673
    assert parse_process_start('process_start_time_seconds{pid="1"} 1.7e9\n') == 1.7e9
    assert parse_process_start("process_start_time_seconds NaN\n") is None
    assert parse_process_start("other 1\n") is None


def test_sim_contract_json_and_advertise_host(tmp_path: Path) -> None:
    path = tmp_path / "contract.json"
    path.write_text('{"engine_version": "9.9.9"}')
    cfg = parse_args(["--contract-json", str(path), "--host", "0.0.0.0", "--advertise-host", "engine-a"])
    assert cfg.contract == {"engine_version": "9.9.9"}
    assert cfg.descriptor_host == "engine-a"
    assert parse_args(["--host", "127.0.0.2"]).descriptor_host == "127.0.0.2"


def test_named_builds_append_their_flags_and_a_degraded_sim_fails_from_the_start() -> None:
    raw = supervisor_config(
        [("e0", 9001)], model="m", builds={"degraded": {"error_rate": 0.2, "version": "0.12.0-rc1"}}
    )
    cfg = SupervisorConfig.model_validate(raw)
    assert cfg.builds == {"degraded": ["--error-rate", "0.2", "--version", "0.12.0-rc1"]}
    sim = parse_args([*cfg.engines[0].command[1:], *cfg.builds["degraded"]])
    assert (sim.error_rate, sim.version) == (0.2, "0.12.0-rc1")
    assert "--error-rate" in sim.launch()["args"]  # another build: another launch digest
    assert "--error-rate" not in parse_args(cfg.engines[0].command[1:]).launch()["args"]
