"""docs/configuration.md is generated from router/config.py and must not drift from it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel, Field

from router import config

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gen_config_docs.py"
DOC = REPO / "docs" / "configuration.md"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_config_docs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_reference_matches_the_models() -> None:
    assert DOC.read_text(encoding="utf-8") == _generator().render(), (
        "docs/configuration.md is stale: run .venv/bin/python scripts/gen_config_docs.py"
    )


def test_every_key_of_every_section_is_documented() -> None:
    text = _generator().render()
    models = [(config.FleetConfig, ""), (config.EngineSpec, "engines[].")]
    for name, field in config.FleetConfig.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            models.append((field.annotation, f"{name}."))
    assert len(models) == 8
    for model, prefix in models:
        for name, field in model.model_fields.items():
            assert f"| `{prefix}{field.alias or name}` |" in text, f"{prefix}{name} missing"
    for name in config.CONTRACT_FIELDS:
        assert f"| `engine_contract.{name}` |" in text
    assert "| `serving.max_request_bytes` | integer (≥ 1024) | `4194304` (4 MiB) |" in text
    assert '| `recovery.engine_restart_policy` | `"individual"` \\| `"whole_wave"` | `"individual"` |' in text
    assert "| `model` | string (non-empty) | required |" in text


def test_a_new_undocumented_key_fails_the_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = _generator()

    class Extended(config.ControlSettings):
        brand_new_key: int = Field(default=1)

    monkeypatch.setattr(gen, "_nested_sections", lambda: [("control", Extended, "control.")])
    with pytest.raises(gen.MissingDescription, match=r"control\.brand_new_key"):
        gen.render()


def test_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text("# old\n", encoding="utf-8")
    cmd = [sys.executable, str(SCRIPT), "--check", "--output", str(stale)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "stale" in proc.stderr
    subprocess.run([sys.executable, str(SCRIPT), "--output", str(stale)], check=True, timeout=60)
    assert subprocess.run(cmd, timeout=60).returncode == 0
