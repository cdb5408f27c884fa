"""Unknown fleet-file keys are refused at start (``narwhal-serve`` exits 2 with one line naming the key
and the file) in every section, ``controller`` included; the keys Narwhal 0.7.0 accepts are the one
exception (``config_keys.PEER_COMPAT``), and the peer's own example fleet file loads unchanged."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from router import config_keys
from router.cli import main
from router.config import ConfigError, load_fleet, parse_fleet
from tests.support.procs import script

REPO = Path(__file__).resolve().parents[2]
PEER_EXAMPLE = REPO / "tests" / "fixtures" / "peer_fleet" / "fleet.example.json"


def _base() -> dict[str, Any]:
    return {"model": "m", "engines": [{"iid": "e0", "url": "http://127.0.0.1:1"}]}


def _write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_misspelt_floor_exits_2_naming_the_key_and_the_file(tmp_path: Path) -> None:
    doc = _base()
    doc["engines"].append({"iid": "e1", "url": "http://127.0.0.1:2"})
    doc["controller"] = {"min_prefil": 2}  # the case: used to start with the floor at 1
    path = _write(tmp_path, doc)
    r = subprocess.run(
        [script("narwhal-serve"), "--fleet", str(path), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "controller.min_prefil" in lines[0] and str(path) in lines[0]


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("controller", "flip_cooldown_s"),  # not a 0.7.0 key either (0.7.0: thresholds.cooldown_s)
        ("serving", "retry_backof_s"),  # retry_* is no longer a wildcard
        ("serving", "max_connection"),
        ("engine", "pool_timeout"),
        ("recovery", "liveness_miss"),
    ],
)
def test_unknown_keys_exit_2_in_every_section(
    section: str, key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _base()
    doc[section] = {key: 1}
    path = _write(tmp_path, doc)
    assert main(["--fleet", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{section}.{key}" in err and str(path) in err


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ({"controller": {"thresholds": {"expnd": 1.0}}}, "controller.thresholds.expnd"),
        ({"controller": {"reactive": {"windows_s": 1}}}, "controller.reactive.windows_s"),
        ({"recovery": {"health": {"band": 2}}}, "recovery.health.band"),
        ({"hardware": {"gpus": 1}}, "hardware.gpus"),
        ({"profiles": {"pth": "x"}}, "profiles.pth"),
    ],
)
def test_unknown_sub_keys_of_peer_objects_are_refused(value: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=rf"f\.json: unknown key {needle.replace('.', '[.]')}"):
        parse_fleet({**_base(), **value}, "f.json")


def test_the_peer_example_fleet_file_loads_unchanged_and_its_unused_keys_are_reported() -> None:
    cfg = load_fleet(PEER_EXAMPLE)
    assert cfg.controller.min_prefill == 1 and cfg.engine.first_token_timeout_s == 2.5
    reported = dict(config_keys.unused_settings(cfg))
    for key in ("hardware", "profiles", "controller.thresholds", "engine.first_token_calibration_path"):
        assert key in reported, reported
    assert not any(k.startswith("_") or "._" in k for k in reported)  # comments are not settings


def test_every_peer_compat_key_is_a_real_unused_key_with_a_reason() -> None:
    assert config_keys.PEER_COMPAT, "the peer-compatibility list is empty"
    for key in config_keys.PEER_COMPAT:
        assert config_keys.UNUSED.get(key)
        assert not key.endswith("*")  # explicit keys, no wildcards
    doc = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert "PEER_COMPAT" in doc


def test_comment_keys_are_dropped_at_any_depth() -> None:
    doc = _base()
    doc["_note"] = "top"
    doc["engines"][0]["_why"] = "engine"
    doc["serving"] = {"_tuning": "later", "max_attempts": 3}
    cfg = parse_fleet(doc)
    assert cfg.serving.max_attempts == 3
    assert config_keys.unused_settings(cfg) == []
