"""Every fleet-file key is either used (by a named module) or declared accepted-but-unused.

Walks the configuration model itself, so a key added to ``router/config.py`` without a line in
``router/config_keys.py`` fails here; so does a stale registry line, a "used" key whose module never
mentions it, an unused key the docs do not mark, and an extra key a section accepts silently.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
from pydantic import BaseModel

from router import config, config_keys
from router.config import ConfigError, parse_fleet

REPO = Path(__file__).resolve().parents[2]


def _model_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(nested model, is a list of it) for a field annotation."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    if get_origin(annotation) is tuple:
        args = [a for a in get_args(annotation) if a is not Ellipsis]
        if len(args) == 1 and isinstance(args[0], type) and issubclass(args[0], BaseModel):
            return args[0], True
    return None, False


def walk(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys: list[str] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        nested, many = _model_of(field.annotation)
        if nested is None:
            keys.append(key)
        else:
            keys += walk(nested, f"{key}[]." if many else f"{key}.")
    return keys


KEYS = walk(config.FleetConfig)
WILDCARDS = [k for k in config_keys.UNUSED if k.endswith("*")]


def test_the_walk_sees_every_section() -> None:
    assert len(KEYS) > 40
    for sample in ("model", "engines[].shared_device", "serving.max_attempts", "ha.lease_ttl_s"):
        assert sample in KEYS


@pytest.mark.parametrize("key", KEYS)
def test_every_key_is_used_or_declared_unused(key: str) -> None:
    used, unused = key in config_keys.USED, key in config_keys.UNUSED
    assert used or unused, f"fleet key {key} is neither in config_keys.USED nor in config_keys.UNUSED"
    assert not (used and unused), f"fleet key {key} is declared both used and unused"


def test_registry_names_only_real_keys() -> None:
    real = set(KEYS)
    stale = [k for k in [*config_keys.USED, *config_keys.UNUSED] if k not in real and not k.endswith("*")]
    assert stale == [], f"registry lines for keys the model does not have: {stale}"


@pytest.mark.parametrize("key", sorted(config_keys.USED))
def test_a_used_key_is_read_by_its_module(key: str) -> None:
    module = REPO / config_keys.USED[key]
    assert module.is_file(), f"{key}: {module} does not exist"
    leaf = key.rsplit(".", 1)[-1]
    assert re.search(rf"\b{re.escape(leaf)}\b", module.read_text(encoding="utf-8")), (
        f"{key} is declared used by {config_keys.USED[key]}, which never mentions {leaf}"
    )


def test_docs_mark_every_unused_key() -> None:
    doc = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    for key in config_keys.UNUSED:
        rows = [line for line in doc.splitlines() if line.startswith(f"| `{key}` |")]
        assert rows, f"{key} has no row in docs/configuration.md"
        assert "**Accepted, not used:**" in rows[0], f"{key} is not marked unused in the docs"
    for key in config_keys.USED:
        rows = [line for line in doc.splitlines() if line.startswith(f"| `{key}` |")]
        assert rows and "Accepted, not used" not in rows[0], key


def _base() -> dict[str, Any]:
    return {"model": "m", "engines": [{"iid": "e0", "url": "http://127.0.0.1:1"}]}


SECTIONS = ["engine", "serving", "recovery", "controller", "control", "ha"]


@pytest.mark.parametrize("section", SECTIONS)
@pytest.mark.parametrize("extra", ["zz_probe", "retry_zz_probe"])
def test_an_extra_key_is_an_error_or_reported_unused(section: str, extra: str) -> None:
    doc = _base()
    doc[section] = {extra: 1}
    try:
        cfg = parse_fleet(doc)
    except ConfigError as exc:
        assert f"{section}.{extra}" in str(exc)
        return
    reported = dict(config_keys.unused_settings(cfg))
    assert f"{section}.{extra}" in reported, f"{section}.{extra} accepted silently"
    assert any(f"{section}." in w for w in WILDCARDS)


def test_startup_report_names_what_the_file_sets() -> None:
    doc = _base()
    doc["engines"][0]["shared_device"] = "gpu0"
    doc["slo"] = {"ttft_s": 1.0, "tpot_s": 0.1}
    doc["controller"] = {"thresholds": {"cooldown_s": 30}}
    line = config_keys.startup_report(parse_fleet(doc))
    assert line.startswith("accepted, not used: ")
    for key in ("engines[].shared_device", "controller.thresholds"):
        assert key in line
    assert "slo" not in line  # slo counts slo_met: used
    assert "unserved" in line  # never-counted counters are named too
    assert "accepted, not used" not in config_keys.startup_report(parse_fleet(_base()))


# -- bad numbers: every numeric key refuses negative and non-finite values, naming the key -------
def _numeric_keys() -> list[tuple[str, type[BaseModel], str]]:
    out: list[tuple[str, type[BaseModel], str]] = []
    for name, field in config.FleetConfig.model_fields.items():
        nested, _ = _model_of(field.annotation)
        if nested is None or nested is config.EngineSpec:
            continue
        for sub, f in nested.model_fields.items():
            if f.annotation in (int, float):
                out.append((name, nested, sub))
    return out


NUMERIC = _numeric_keys()


def test_numeric_walk_is_not_empty() -> None:
    assert len(NUMERIC) > 20


@pytest.mark.parametrize(("section", "model", "key"), NUMERIC, ids=[f"{s}.{k}" for s, _, k in NUMERIC])
@pytest.mark.parametrize("value", [-1, -0.5, math.nan, math.inf, -math.inf])
def test_negative_or_non_finite_numbers_are_refused_naming_the_key(
    section: str, model: type[BaseModel], key: str, value: float, tmp_path: Path
) -> None:
    doc = _base()
    doc[section] = {key: value}
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(doc))  # json writes NaN / Infinity literals, as a hand-edited file may
    with pytest.raises(ConfigError) as err:
        config.load_fleet(path)
    assert f"{section}.{key}" in str(err.value) and str(path) in str(err.value)


def test_floors_above_the_fleet_are_refused() -> None:
    doc = _base()
    doc["controller"] = {"min_decode": 2}
    with pytest.raises(ConfigError, match=r"controller.min_decode = 2 exceeds the 1 configured engine"):
        parse_fleet(doc)


def test_narwhal_serve_exits_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from router.cli import main

    doc = _base()
    doc["serving"] = {"request_timeout_s": math.inf}
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(doc))
    assert main(["--fleet", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "serving.request_timeout_s" in err and str(path) in err
