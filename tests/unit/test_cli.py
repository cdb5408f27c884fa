"""``narwhal-serve`` CLI: fleet loading (0.7.0 files accepted, unknown keys named), exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from router.assemble import RouterOptions, build_router
from router.cli import build_parser, main, options_from_args
from router.config import load_fleet
from tests.support.procs import script

PEER_FLEET: dict[str, Any] = {
    "schema": "narwhal.fleet",
    "schema_version": 2,
    "model": "m",
    "engines": [
        {"iid": "e0", "url": "http://127.0.0.1:1/", "role": "prefill"},
        {"iid": "e1", "url": "http://127.0.0.1:2", "role": "decode", "pin": True},
    ],
    "slo": {"ttft_s": 1.0, "tpot_s": 0.05},
    "profiles": {"path": "runs/profiles.json"},
    "engine": {"tokenize": False, "first_token_timeout_s": 2.5},
    "serving": {"admission": "predictive", "retry_budget": 0.1, "max_attempts": 3},
    "controller": {"monitor_interval_s": 1.0, "thresholds": {"cooldown_s": 30}},
}


def write(tmp_path: Path, doc: dict[str, Any], name: str = "fleet.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def test_peer_070_fleet_file_is_accepted(tmp_path: Path) -> None:
    cfg = load_fleet(write(tmp_path, PEER_FLEET))
    assert cfg.serving.max_attempts == 3 and cfg.engines[0].url == "http://127.0.0.1:1"
    assert "engine.tokenize" in cfg.unused_keys() and "slo" not in cfg.unused_keys()  # slo → slo_met
    app, core = build_router(cfg, RouterOptions(journal=str(tmp_path / "j.jsonl")))
    assert sorted(core.scheduler.engines) == ["e0", "e1"]
    paths = {r.resource.canonical for r in app.router.routes() if r.resource is not None}
    assert {"/v1/completions", "/v1/chat/completions", "/health", "/ready", "/metrics", "/v1/models"} <= paths


def test_unknown_key_exits_2_naming_key_and_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(tmp_path, {**PEER_FLEET, "engine": {"tokenize": True, "turbo": 1}})
    assert main(["--fleet", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert str(bad) in err and "engine.turbo" in err


def test_missing_file_and_bad_flag_values_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--fleet", str(tmp_path / "nope.json")]) == 2
    assert "nope.json" in capsys.readouterr().err
    good = write(tmp_path, PEER_FLEET)
    assert main(["--fleet", str(good), "--max-concurrent", "0"]) == 2
    assert "--max-concurrent" in capsys.readouterr().err
    assert main(["--fleet", str(good), "--graceful-timeout", "nan"]) == 2


def test_yaml_fleet_and_flags_reach_options(tmp_path: Path) -> None:
    import yaml

    p = tmp_path / "fleet.yaml"
    p.write_text(yaml.safe_dump(PEER_FLEET))
    assert load_fleet(p).model == "m"
    ns = build_parser().parse_args(
        ["--fleet", str(p), "--port", "9", "--max-concurrent", "5", "--probe-interval", "0.5"]
    )
    opts = options_from_args(ns)
    assert (opts.port, opts.max_concurrent, opts.probe_interval, opts.host) == (9, 5, 0.5, "127.0.0.1")


def test_installed_script_exit_code(tmp_path: Path) -> None:
    bad = write(tmp_path, {**PEER_FLEET, "bogus": 1})
    r = subprocess.run(
        [script("narwhal-serve"), "--fleet", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2
    assert "bogus" in r.stderr and str(bad) in r.stderr


def test_unset_control_token_env_is_a_usage_error(tmp_path: Path) -> None:
    fleet = write(tmp_path, {**PEER_FLEET, "control": {"token_env": "NARWHAL_TEST_TOKEN_UNSET"}})
    env = {k: v for k, v in os.environ.items() if k != "NARWHAL_TEST_TOKEN_UNSET"}
    r = subprocess.run(
        [script("narwhal-serve"), "--fleet", str(fleet), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 2
    assert "NARWHAL_TEST_TOKEN_UNSET" in r.stderr and "Traceback" not in r.stderr


def test_tune_gc_freezes_startup_objects_and_raises_the_young_threshold() -> None:
    import gc

    from router.cli import GC_YOUNG_THRESHOLD, tune_gc

    before_threshold, before_frozen = gc.get_threshold(), gc.get_freeze_count()
    try:
        tune_gc()
        threshold = gc.get_threshold()
        assert threshold == (GC_YOUNG_THRESHOLD, *before_threshold[1:])
        assert gc.get_freeze_count() > before_frozen
    finally:
        gc.unfreeze()
        gc.set_threshold(*before_threshold)
