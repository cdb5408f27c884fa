"""Deployment files stay valid: compose parses, every narwhal-* command exists, the fleet file loads."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.config import load_fleet, parse_fleet

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
DEPLOY = REPO / "deploy"

pytestmark = pytest.mark.integration


def _scripts() -> set[str]:
    with (REPO / "pyproject.toml").open("rb") as f:
        return set(tomllib.load(f)["project"]["scripts"])


@pytest.fixture(scope="module")
def compose_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The operator's deploy/narwhal.env does not exist in a checkout: a throwaway one."""
    env_file = tmp_path_factory.mktemp("compose") / "narwhal.env"
    env_file.write_text("NARWHAL_CONTROL_TOKEN=test-only\n", encoding="utf-8")
    return {**os.environ, "NARWHAL_ENV_FILE": str(env_file)}


def _compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _words(value: Any) -> list[str]:
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list):
        return [str(v) for v in value]
    return []


def _narwhal_commands(node: Any) -> Iterator[str]:
    """Every word starting with ``narwhal-`` in a command-like position, anywhere in a document."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("command", "entrypoint"):
                yield from (w for w in _words(value) if w.startswith("narwhal-"))
            else:
                yield from _narwhal_commands(value)
    elif isinstance(node, list):
        if node and isinstance(node[0], str) and node[0].startswith("narwhal-"):
            yield node[0]
        for item in node:
            yield from _narwhal_commands(item)


def test_compose_file_validates_with_docker_compose() -> None:
    """Runs scripts/check_compose.sh, which installs docker-compose if missing; failure is a failure."""
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "check_compose.sh")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"check_compose.sh failed:\n{proc.stdout}\n{proc.stderr}"
    assert "docker-compose.yml is valid" in proc.stdout


def test_compose_config_resolves_the_expected_services(compose_env: dict[str, str]) -> None:
    proc = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config", "--services"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=compose_env,
    )
    assert proc.returncode == 0, proc.stderr
    services = set(proc.stdout.split())
    assert {
        "postgresql",
        "temporal",
        "temporal-ui",
        "router-a",
        "router-b",
        "worker",
        "supervisor",
        "otel-collector",
        "jaeger",
        "etcd",
    } <= services


def test_every_narwhal_command_is_a_console_script() -> None:
    scripts = _scripts()
    found: dict[str, list[str]] = {"docker-compose.yml": list(_narwhal_commands(_compose()))}
    cmd_lines = [
        ln for ln in (REPO / "Dockerfile").read_text(encoding="utf-8").splitlines() if ln.startswith("CMD ")
    ]
    found["Dockerfile"] = list(_narwhal_commands([json.loads(ln.removeprefix("CMD ")) for ln in cmd_lines]))
    for path in sorted(DEPLOY.glob("*.json")):
        found[path.name] = list(_narwhal_commands(json.loads(path.read_text(encoding="utf-8"))))
    assert found["docker-compose.yml"], "no narwhal-* command found in docker-compose.yml"
    assert found["supervisor.json"], "no narwhal-* command found in deploy/supervisor.json"
    assert found["Dockerfile"] == ["narwhal-serve"]
    unknown = {name: sorted(set(cmds) - scripts) for name, cmds in found.items() if set(cmds) - scripts}
    assert unknown == {}, f"commands missing from [project.scripts]: {unknown}"


def test_scanner_sees_an_unknown_command() -> None:
    doc = {"services": {"x": {"command": "narwhal-nope --flag"}}, "engines": [{"command": ["narwhal-x"]}]}
    assert sorted(_narwhal_commands(doc)) == ["narwhal-nope", "narwhal-x"]


def test_fleet_file_validates() -> None:
    data = json.loads((DEPLOY / "fleet.json").read_text(encoding="utf-8"))
    cfg = parse_fleet(data, "deploy/fleet.json")
    assert cfg.contract_complete, "the lifecycle API (drain/readmit) needs a complete engine_contract"
    assert load_fleet(DEPLOY / "fleet.json") == cfg
    assert {e.role for e in cfg.engines} == {"prefill", "decode"}
    for engine in cfg.engines:
        assert engine.attestation_url, f"{engine.iid}: readmission needs an attestation_url"


def test_failover_override_validates_and_makes_router_a_a_standby_of_b(compose_env: dict[str, str]) -> None:
    override = DEPLOY / "compose.router-a-standby.yml"
    proc = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "-f", str(override), "config"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=compose_env,
    )
    assert proc.returncode == 0, proc.stderr
    merged = yaml.safe_load(proc.stdout)["services"]
    cmd = _words(merged["router-a"]["command"])
    assert cmd[cmd.index("--standby-of") + 1] == "http://router-b:8100"
    assert cmd[cmd.index("--etcd-endpoints") + 1] == "http://etcd:2379"
    assert "--lease-path" not in cmd
    assert list(_narwhal_commands(yaml.safe_load(override.read_text(encoding="utf-8")))) == ["narwhal-serve"]


def test_supervisor_file_loads_and_engines_attest_the_fleet_contract() -> None:
    from fleet.contract import DEFAULT_CONTRACT
    from fleet.supervisor import load_config

    cfg = load_config(DEPLOY / "supervisor.json")
    assert [e.iid for e in cfg.engines] == load_fleet(DEPLOY / "fleet.json").engine_ids
    for engine in cfg.engines:
        assert "--contract-json" not in engine.command, "simulators attest DEFAULT_CONTRACT"
    assert load_fleet(DEPLOY / "fleet.json").engine_contract == DEFAULT_CONTRACT


def test_fleet_and_supervisor_agree_on_engines() -> None:
    fleet = load_fleet(DEPLOY / "fleet.json")
    supervisor = json.loads((DEPLOY / "supervisor.json").read_text(encoding="utf-8"))
    sup = {e["iid"]: e for e in supervisor["engines"]}
    assert set(sup) == set(fleet.engine_ids)
    for engine in fleet.engines:
        command = sup[engine.iid]["command"]
        port = engine.url.rsplit(":", 1)[1]
        assert command[command.index("--port") + 1] == port, engine.iid
        assert command[command.index("--iid") + 1] == engine.iid
        assert command[command.index("--model") + 1] == fleet.model
        assert command[command.index("--host") + 1] == "0.0.0.0", "engines must be reachable from routers"


def test_compose_routers_lease_through_etcd_and_export_traces() -> None:
    services = _compose()["services"]
    assert "etcd" in services and "healthcheck" in services["etcd"]
    for name in ("router-a", "router-b"):
        cmd = _words(services[name]["command"])
        assert cmd[cmd.index("--etcd-endpoints") + 1] == "http://etcd:2379"
        assert "--lease-path" not in cmd  # no shared lease volume: the routers may be on two hosts
        assert not any(":/shared" in v for v in services[name]["volumes"])
        assert cmd[cmd.index("--fleet") + 1] == "/config/fleet.json"
    standby = _words(services["router-b"]["command"])
    assert standby[standby.index("--standby-of") + 1] == "http://router-a:8100"
    assert "--standby-of" not in _words(services["router-a"]["command"])
    for name in ("router-a", "router-b", "worker", "supervisor", "narwhal-cli"):
        env = services[name]["environment"]
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4318", name
    assert services["worker"]["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"


@pytest.mark.parametrize("path", sorted(p.name for p in (DEPLOY / "temporal").glob("*.sh")))
def test_temporal_setup_scripts_are_valid_shell(path: str) -> None:
    proc = subprocess.run(["sh", "-n", str(DEPLOY / "temporal" / path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_namespace_script_registers_every_search_attribute_the_workflows_use() -> None:
    kinds = {"keyword": "Keyword", "int": "Int", "text": "Text", "float": "Double", "bool": "Bool"}
    used: set[str] = set()
    for path in sorted((REPO / "workflows").glob("*.py")):
        for kind, name in re.findall(r'SearchAttributeKey\.for_(\w+)\("(\w+)"\)', path.read_text("utf-8")):
            used.add(f"{name}={kinds.get(kind, kind)}")
    assert used, "no search attributes found in workflows/"
    script = (DEPLOY / "temporal" / "create-namespace.sh").read_text(encoding="utf-8")
    (line,) = [ln for ln in script.splitlines() if ln.startswith("for sa in ")]
    registered = set(line.removeprefix("for sa in ").removesuffix("; do").split())
    assert used <= registered, f"not registered in create-namespace.sh: {sorted(used - registered)}"


def test_shipped_control_plane_needs_a_token_and_is_not_published(compose_env: dict[str, str]) -> None:
    fleet = load_fleet(DEPLOY / "fleet.json")
    assert fleet.control.token_env == "NARWHAL_CONTROL_TOKEN" and fleet.control.protect_reads
    assert fleet.control.port == 8100
    proc = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=compose_env,
    )
    assert proc.returncode == 0, proc.stderr
    services = yaml.safe_load(proc.stdout)["services"]
    for name in ("router-a", "router-b", "worker", "narwhal-cli"):
        assert services[name]["environment"]["NARWHAL_CONTROL_TOKEN"] == "test-only", name
    for name, service in services.items():
        published = {str(p.get("target")) for p in service.get("ports", []) if isinstance(p, dict)}
        published |= {str(p).rsplit(":", 1)[-1] for p in service.get("ports", []) if not isinstance(p, dict)}
        assert "8100" not in published, f"{name} publishes the control listener"
    assert "deploy/narwhal.env" in (REPO / ".gitignore").read_text(encoding="utf-8")
    readme = (REPO / "README.md").read_text(encoding="utf-8") + (REPO / "docs" / "deployment.md").read_text(
        encoding="utf-8"
    )
    assert "deploy/narwhal.env" in readme and "NARWHAL_CONTROL_TOKEN" in readme


def test_compose_without_the_env_file_is_refused() -> None:
    env = {**os.environ, "NARWHAL_ENV_FILE": str(REPO / "deploy" / "no-such.env")}
    proc = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config", "-q"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode != 0 and "no-such.env" in proc.stderr + proc.stdout


def _resolved(compose_env: dict[str, str], *overrides: Path) -> dict[str, Any]:
    files = [a for f in (COMPOSE, *overrides) for a in ("-f", str(f))]
    proc = subprocess.run(
        ["docker-compose", *files, "config"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=compose_env,
    )
    assert proc.returncode == 0, proc.stderr
    services: dict[str, Any] = yaml.safe_load(proc.stdout)["services"]
    return services


def _published(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(host ip, published port) of each port mapping ("" = every interface)."""
    out = []
    for p in service.get("ports", []):
        if isinstance(p, dict):
            out.append((str(p.get("host_ip", "")), str(p.get("published", ""))))
        else:
            parts = str(p).split(":")
            out.append((parts[0] if len(parts) == 3 else "", parts[-2] if len(parts) > 1 else parts[0]))
    return out


def test_compose_publishes_only_the_client_ports_and_the_ui_override_binds_loopback(
    compose_env: dict[str, str],
) -> None:
    services = _resolved(compose_env)
    published = {name: _published(s) for name, s in services.items() if s.get("ports")}
    assert published == {"router-a": [("", "8000")], "router-b": [("", "8001")]}, published
    ui = _resolved(compose_env, DEPLOY / "compose.ui-loopback.yml")
    for name in ("temporal-ui", "jaeger", "otel-collector"):
        assert ui[name]["ports"] and all(ip == "127.0.0.1" for ip, _ in _published(ui[name])), ui[name][
            "ports"
        ]
    assert not ui["temporal"].get("ports"), "the Temporal frontend is never published"


def test_compose_etcd_comes_from_etcds_own_registry_pinned_with_etcds_command_line() -> None:
    etcd = _compose()["services"]["etcd"]
    image = str(etcd["image"]).split(":-", 1)[-1].rstrip("}")
    assert image.startswith(("gcr.io/etcd-development/etcd:v3.", "quay.io/coreos/etcd:v3.")), image
    cmd = _words(etcd["command"])
    assert cmd[0] == "/usr/local/bin/etcd" and "--advertise-client-urls=http://etcd:2379" in cmd
    assert "--listen-client-urls=http://0.0.0.0:2379" in cmd and "--data-dir=/etcd-data" in cmd
    assert "etcd-data:/etcd-data" in etcd["volumes"]


def test_check_compose_refuses_an_image_off_the_allow_list(tmp_path: Path) -> None:
    override = tmp_path / "compose.bad.yml"
    override.write_text("services:\n  etcd:\n    image: bitnami/etcd:3.5\n", encoding="utf-8")
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "check_compose.sh"), str(COMPOSE), str(override)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "image bitnami/etcd:3.5" in proc.stderr and "not on deploy/image-allowlist.txt" in proc.stderr


def test_compose_worker_uses_its_own_configuration_of_routers_and_tokens() -> None:
    from activities.worker_config import load_file

    worker = _compose()["services"]["worker"]
    cmd = _words(worker["command"])
    assert (
        cmd[cmd.index("--config") + 1] == "/config/worker.json" and "./deploy:/config:ro" in worker["volumes"]
    )
    cfg = load_file(DEPLOY / "worker.json")
    compose = cfg.routers["compose"]
    assert compose.token_env == "NARWHAL_CONTROL_TOKEN"
    assert {"http://router-a:8100", "http://router-b:8100"} <= set(compose.urls)
    docs = (REPO / "docs" / "deployment.md").read_text(encoding="utf-8") + COMPOSE.read_text(encoding="utf-8")
    assert "docker-compose up" not in docs and "docker-compose run" not in docs  # v2 syntax: docker compose
