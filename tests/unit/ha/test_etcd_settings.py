"""etcd backend selection: flags and fleet keys, and their bad input (exit 2 naming the flag)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.fleetgen import fleet_document
from router.assemble import RouterOptions, assemble
from router.cli import main
from router.config import parse_fleet
from router.ha.etcd_lease import EtcdLease, default_prefix
from router.ha.service import HAService
from router.ha.settings import from_options


def _fleet(tmp_path: Path, **ha: object) -> Path:
    doc = fleet_document(
        [("e0", "http://127.0.0.1:9", "decode")], model="org/Model-7B", state_path=str(tmp_path / "s.json")
    )
    if ha:
        doc["ha"] = ha
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--etcd-endpoints", "127.0.0.1:2379"],
            "--etcd-endpoints: etcd endpoint '127.0.0.1:2379' must start with http",
        ),
        (
            ["--etcd-endpoints", "http://127.0.0.1"],
            "--etcd-endpoints: etcd endpoint 'http://127.0.0.1' has no port",
        ),
        (["--etcd-endpoints", "http://127.0.0.1:1,"], "--etcd-endpoints: empty etcd endpoint"),
        (["--etcd-endpoints", "http://[::1"], "--etcd-endpoints: etcd endpoint 'http://[::1' is not a URL"),
        (
            ["--etcd-endpoints", "http://127.0.0.1:2379", "--lease-path", "x.lease"],
            "--lease-path and --etcd-endpoints are mutually exclusive",
        ),
        (
            ["--etcd-endpoints", "http://127.0.0.1:2379", "--etcd-prefix", "narwhal"],
            "--etcd-prefix: etcd prefix",
        ),
        (["--etcd-prefix", "/n/"], "--etcd-prefix requires --etcd-endpoints"),
        (["--etcd-cacert", "ca.pem"], "--etcd-cacert requires --etcd-endpoints"),
        (
            ["--etcd-endpoints", "https://127.0.0.1:2379", "--etcd-cacert", "/nonexistent/ca.pem"],
            "--etcd-cacert: /nonexistent/ca.pem is not a readable file",
        ),
        (
            ["--etcd-endpoints", "https://127.0.0.1:2379", "--etcd-cert", "/nonexistent/c.pem"],
            "--etcd-cert and --etcd-key go together",
        ),
        (
            ["--etcd-endpoints", "http://127.0.0.1:2379", "--etcd-cacert", __file__],
            "--etcd-cacert/--etcd-cert need https:// etcd endpoints",
        ),
        (
            ["--etcd-endpoints", "http://127.0.0.1:2379", "--etcd-user", "root"],
            "--etcd-user requires --etcd-password-env",
        ),
        (
            [
                "--etcd-endpoints",
                "http://127.0.0.1:2379",
                "--etcd-user",
                "root",
                "--etcd-password-env",
                "NARWHAL_UNSET_PW",
            ],
            "--etcd-password-env: environment variable NARWHAL_UNSET_PW is not set",
        ),
    ],
)
def test_bad_etcd_flags_exit_2_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["--fleet", str(_fleet(tmp_path)), "--port", "1", *args]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("narwhal-serve: error:")]
    assert len(errors) == 1 and message in errors[0], err
    assert "Traceback" not in err


def test_fleet_file_lease_path_plus_etcd_endpoints_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = _fleet(tmp_path, lease_path=str(tmp_path / "l"), etcd_endpoints="http://127.0.0.1:2379")
    assert main(["--fleet", str(fleet), "--port", "1"]) == 2
    assert "mutually exclusive" in capsys.readouterr().err


def test_etcd_settings_from_the_fleet_file_and_flags(tmp_path: Path) -> None:
    cfg = parse_fleet(json.loads(_fleet(tmp_path, etcd_endpoints="http://127.0.0.1:2379").read_text()))
    ha = assemble(cfg, RouterOptions(router_id="r1", lease_ttl=3.0)).ha
    assert isinstance(ha, HAService) and isinstance(ha.lease, EtcdLease)
    assert ha.lease.settings.prefix == "/narwhal/org_Model-7B/" == default_prefix("org/Model-7B")
    assert ha.lease.settings.ttl_s == 3.0 and ha.lease.holder.startswith("r1:")
    assert ha.lease.handoff_key == b"/narwhal/org_Model-7B/handoff"
    opts = RouterOptions(etcd_endpoints="http://127.0.0.1:1,http://127.0.0.1:2", etcd_prefix="/x/y/")
    lease = assemble(cfg, opts).ha.lease
    assert isinstance(lease, EtcdLease) and lease.holder_key == b"/x/y/holder"
    assert lease.client.endpoints == ("http://127.0.0.1:1", "http://127.0.0.1:2")


def test_etcd_tls_and_auth_from_the_fleet_file_reach_the_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NARWHAL_TEST_PW", "s3cr3t-value")
    ca = tmp_path / "ca.pem"
    ca.write_text("not read until the client connects\n")
    fleet = _fleet(
        tmp_path,
        etcd_endpoints="https://127.0.0.1:2379",
        etcd_user="narwhal",
        etcd_password_env="NARWHAL_TEST_PW",
    )
    cfg = parse_fleet(json.loads(fleet.read_text()))
    runtime = from_options(cfg, RouterOptions(router_id="r1", etcd_cacert=str(ca)))
    sec = runtime.etcd_security()
    assert (sec.cacert, sec.user, sec.password) == (str(ca), "narwhal", "s3cr3t-value")
    assert "s3cr3t-value" not in repr(sec)  # never in a log line or a traceback
