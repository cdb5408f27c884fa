"""Settings are resolved once, flags over the fleet file, into one frozen value the router is built
from: what a flag sets wins, what it leaves unset comes from the fleet file, and a combination that
cannot work is an exit 2 before anything starts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from router.assemble import build
from router.cli import main
from router.config import parse_fleet
from router.options import RouterOptions
from router.settings import resolve


def _fleet(**sections: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "engines": [{"iid": "e0", "url": "http://127.0.0.1:1"}, {"iid": "e1", "url": "http://127.0.0.1:2"}],
        **sections,
    }


def test_flags_win_and_the_fleet_file_fills_the_rest(tmp_path: Path) -> None:
    cfg = parse_fleet(
        _fleet(
            serving={"max_connections": 50, "graceful_timeout_s": 12.0},
            ha={"lease_ttl_s": 6.0, "router_id": "from-file"},
            control={"port": 9100},
        )
    )
    from_file = resolve(cfg, RouterOptions(port=8001))
    assert (from_file.seats, from_file.graceful_timeout_s) == (50, 12.0)
    assert (from_file.ha.lease_ttl_s, from_file.ha.router_id) == (6.0, "from-file")
    assert from_file.control is not None and from_file.control.port == 9100
    flags = resolve(
        cfg,
        RouterOptions(
            port=8001, max_concurrent=7, graceful_timeout=3.0, lease_ttl=8.0, router_id="flag", control_port=0
        ),
    )
    assert (flags.seats, flags.graceful_timeout_s) == (7, 3.0)
    assert (flags.ha.lease_ttl_s, flags.ha.router_id) == (8.0, "flag")
    assert flags.control is None  # --control-port 0 turns the fleet file's listener off
    with pytest.raises(dataclasses.FrozenInstanceError):
        flags.seats = 1  # type: ignore[misc]


def test_the_router_is_built_from_the_resolved_settings(tmp_path: Path) -> None:
    cfg = parse_fleet(_fleet(serving={"max_connections": 50}))
    settings = resolve(cfg, RouterOptions(max_concurrent=7, journal=str(tmp_path / "j.jsonl")))
    router = build(settings)
    assert router.settings is settings
    assert router.parts.serving.seats == 7  # --max-concurrent: the admission limit
    assert router.parts.engines.pool.max_open == 50  # serving.max_connections: the engine pool
    assert router.ha.settings is settings.ha


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--ha-mode", "active-active"], "requires the etcd backend"),
        (["--control-port", "8000", "--port", "8000"], "the listeners need distinct ports"),
        (["--standby-of", "http://127.0.0.1:1"], "--standby-of requires --lease-path"),
    ],
)
def test_settings_that_cannot_work_exit_2_before_start(
    args: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(_fleet()))
    assert main(["--fleet", str(path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err
