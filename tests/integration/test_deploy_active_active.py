"""The active-active compose override: three serving replicas on etcd behind a /ready-checked balancer."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.cli import build_parser, options_from_args
from router.config import load_fleet
from router.ha import settings as ha_settings
from router.replicas import wiring as replica_wiring

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
OVERRIDE = REPO / "deploy" / "compose.active-active.yml"
HAPROXY = REPO / "deploy" / "haproxy-active-active.cfg"
REPLICAS = ("router-a", "router-b", "router-c")


def merged(tmp_path: Path) -> dict[str, Any]:
    env_file = tmp_path / "narwhal.env"  # the operator's deploy/narwhal.env is never committed
    env_file.write_text("NARWHAL_CONTROL_TOKEN=test-only\n", encoding="utf-8")
    proc = subprocess.run(
        ["docker-compose", "-f", "docker-compose.yml", "-f", str(OVERRIDE), "config"],
        cwd=REPO,
        env={**os.environ, "NARWHAL_ENV_FILE": str(env_file)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    services: dict[str, Any] = yaml.safe_load(proc.stdout)["services"]
    return services


def words(command: Any) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def test_three_replicas_run_active_active_on_one_etcd_with_distinct_ids(tmp_path: Path) -> None:
    services = merged(tmp_path)
    assert {"etcd", "router-lb", *REPLICAS} <= set(services)
    ids, urls = set(), set()
    fleet = load_fleet(REPO / "deploy" / "fleet.json")
    for name in REPLICAS:
        cmd = words(services[name]["command"])
        assert cmd[0] == "narwhal-serve" and "--standby-of" not in cmd, name
        assert cmd[cmd.index("--ha-mode") + 1] == "active-active"
        assert cmd[cmd.index("--etcd-endpoints") + 1] == "http://etcd:2379"
        ids.add(cmd[cmd.index("--router-id") + 1])
        urls.add(cmd[cmd.index("--advertise-url") + 1])
        args = [*cmd[1:]]
        args[args.index("--fleet") + 1] = str(REPO / "deploy" / "fleet.json")
        options = options_from_args(build_parser().parse_args(args))
        runtime = ha_settings.from_options(fleet, options, port=options.port)
        settings, endpoints = replica_wiring.settings_for(fleet, options, runtime)
        assert settings is not None and endpoints == "http://etcd:2379"
        # the control listener, what the other replicas and the restart worker reach
        assert settings.control_url == f"http://{name}:8100"
        assert services[name]["environment"]["NARWHAL_CONTROL_TOKEN"] == "test-only"
    assert len(ids) == 3 and len(urls) == 3


def test_the_balancer_checks_ready_on_every_replica(tmp_path: Path) -> None:
    services = merged(tmp_path)
    lb = services["router-lb"]
    assert any(str(v).endswith("haproxy.cfg:ro") or "haproxy" in str(v) for v in lb["volumes"])
    cfg = HAPROXY.read_text(encoding="utf-8")
    assert re.search(r"option httpchk GET /ready", cfg)
    assert re.search(r"http-check expect status 200", cfg)
    servers = re.findall(r"^\s*server (\S+) (\S+):8000 check", cfg, flags=re.M)
    assert sorted(s for s, _ in servers) == sorted(REPLICAS)
