"""narwhal-serve HA flags (spec §12, §14 test_failover_controls): finite values only, range checks,
standby needs a lease, fractional values reach the lease; the fleet file's ``ha`` section works too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from router import cli
from router.assemble import RouterOptions, assemble, build_router
from router.config import parse_fleet
from router.ha.service import HAService
from tests.unit.ha.helpers import fleet

FLOAT_FLAGS = [
    "--lease-ttl",
    "--lease-renew-interval",
    "--lease-safety-margin",
    "--standby-probe-interval",
    "--standby-max-handoff-age",
]


@pytest.mark.parametrize("flag", FLOAT_FLAGS)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_cli_rejects_non_finite_before_touching_files(
    flag: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "absent" / "fleet.json"  # never read: the flag check comes first
    rc = cli.main(["--fleet", str(missing), "--lease-path", str(tmp_path / "l"), f"{flag}={value}"])
    assert rc == 2
    assert f"{flag} must be finite" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def _fleet_file(tmp_path: Path, **ha: Any) -> Path:
    doc = json.loads(fleet().model_dump_json(by_alias=True))
    doc["recovery"]["state_path"] = str(tmp_path / "state.json")
    if ha:
        doc["ha"] = ha
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--standby-of", "http://127.0.0.1:1"], "--standby-of requires --lease-path"),
        (["--lease-path", "L", "--lease-ttl", "1", "--lease-renew-interval", "0.5", "--lease-safety-margin", "0.5"],
         "lease_ttl must exceed"),
        (["--lease-path", "L", "--lease-safety-margin", "-0.1"], "lease_safety_margin must be >= 0"),
        (["--lease-path", "L", "--standby-probe-interval", "0"], "standby_probe_interval must be finite and positive"),
        (["--lease-path", "L", "--standby-max-handoff-age", "-1"], "standby_max_handoff_age must be"),
        (["--lease-path", "L", "--standby-takeover-after", "0"], "--standby-takeover-after must be >= 1"),
    ],
)  # fmt: skip
def test_cli_range_errors_exit_2(
    tmp_path: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet_path = _fleet_file(tmp_path)
    rc = cli.main(
        ["--fleet", str(fleet_path), *[a.replace("L", str(tmp_path / "l")) if a == "L" else a for a in args]]
    )
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "l").exists()


def test_build_router_rejects_the_same_ranges(tmp_path: Path) -> None:
    cfg = parse_fleet(json.loads(_fleet_file(tmp_path).read_text()))
    with pytest.raises(ValueError, match="lease_ttl must exceed"):
        build_router(cfg, RouterOptions(lease_path=str(tmp_path / "l"), lease_ttl=1.5))
    with pytest.raises(ValueError, match="must be finite"):
        build_router(cfg, RouterOptions(lease_path=str(tmp_path / "l"), lease_ttl=float("nan")))
    with pytest.raises(ValueError, match="requires --lease-path"):
        build_router(cfg, RouterOptions(standby_of="http://127.0.0.1:1"))


def test_fractional_values_reach_the_lease(tmp_path: Path) -> None:
    cfg = parse_fleet(json.loads(_fleet_file(tmp_path).read_text()))
    options = RouterOptions(
        lease_path=str(tmp_path / "l"),
        router_id="router-x",
        lease_ttl=0.8,
        lease_renew_interval=0.2,
        lease_safety_margin=0.1,
        standby_probe_interval=0.05,
        standby_takeover_after=2,
    )
    ha = assemble(cfg, options).ha
    assert isinstance(ha, HAService) and ha.lease is not None
    s = ha.lease.settings
    assert (s.ttl_s, s.renew_interval_s, s.safety_margin_s) == (0.8, 0.2, 0.1)
    assert ha.lease.holder.startswith("router-x:")
    assert ha.settings.standby_probe_interval_s == 0.05 and ha.settings.standby_takeover_after == 2
    assert not (tmp_path / "l").exists()  # nothing touched before start


def test_fleet_file_ha_section_and_flag_override(tmp_path: Path) -> None:
    path = _fleet_file(tmp_path, lease_path=str(tmp_path / "l"), lease_ttl_s=3.0, router_id="from-file")
    cfg = parse_fleet(json.loads(path.read_text()))
    ha = assemble(cfg, RouterOptions(lease_ttl=2.5)).ha
    assert ha.lease is not None
    assert ha.lease.settings.ttl_s == 2.5 and ha.lease.holder.startswith("from-file:")
    bad = dict(json.loads(path.read_text()))
    bad["ha"]["lease_ttl_s"] = float("inf")
    with pytest.raises(ValueError):
        parse_fleet(bad)
