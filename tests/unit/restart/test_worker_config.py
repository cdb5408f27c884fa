"""The worker's own configuration and the command templates (pure parts): parsing, refusals,
single-pass rendering, flags over the file, re-reading a changed file, Temporal TLS settings."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from activities.commands import TemplateError, Values, check_shell, parse_exec, render_exec, render_shell
from activities.supervisor import command_env
from activities.worker_config import (
    CommandTemplate,
    Refused,
    WorkerConfigError,
    WorkerSettings,
    add_flags,
    flag_overrides,
    parse_config,
    resolve_router,
    resolve_template,
)
from narwhal_models.restart import RouterRef, SupervisorRef
from router.ids import UnsafeValue, check_engine_id, check_engine_url
from workflows.client import Security, TemporalUnavailable, add_connection_flags, security

PEER = Path(__file__).resolve().parents[2] / "fixtures" / "peer_examples"


def test_engine_ids_and_urls() -> None:
    for ok in ("e0", "e1", "e2", "p1", "vllm-decode.3", "A_b", "x" * 64):
        assert check_engine_id(ok) == ok
    for bad in ("", "x{url}", "e0;rm", "$(id)", "e 0", "é", "x" * 65, "e0\n"):
        with pytest.raises(UnsafeValue, match="must match"):
            check_engine_id(bad)
    assert check_engine_url("http://127.0.0.1:9000/") == "http://127.0.0.1:9000"
    assert check_engine_url("https://gpu-0.example:8443/v1") == "https://gpu-0.example:8443/v1"
    assert check_engine_url("http://[::1]:8000") == "http://[::1]:8000"
    for bad in ("file:///etc/passwd", "http://h/;touch x", "http://h/$(id)", "http://u:p@h/", "http://h/?a=1",
                "http://-oProxyCommand=x/", "http://h:1 x", "http:///x", "ftp://h"):  # fmt: skip
        with pytest.raises(UnsafeValue, match="refused"):
            check_engine_url(bad)


def test_the_peers_engine_ids_pass() -> None:
    for path in sorted(PEER.glob("*.json")):
        doc = json.loads(path.read_text())
        body = doc.get("body", doc)
        for iid in (body.get("engines") or {}) if isinstance(body.get("engines"), dict) else []:
            assert check_engine_id(iid) == iid, path.name


def test_render_is_one_pass_inside_one_argument() -> None:
    argv = parse_exec("systemctl restart 'vllm@{iid}' --url={url} {{literal}}")
    out = render_exec(argv, Values("x{url}", "http://h:1/p"))
    assert out == ["systemctl", "restart", "vllm@x{url}", "--url=http://h:1/p", "{literal}"]
    ssh = render_exec(parse_exec("ssh -- {host} run vllm@{iid!q} {port}"), Values("a;b", "https://gpu:8443"))
    assert ssh == ["ssh", "--", "gpu", "run", "vllm@'a;b'", "8443"]
    assert render_shell("run {iid} {url}", Values("$(id)", "")) == "run '$(id)' ''"
    with pytest.raises(TemplateError, match="unknown placeholder"):
        parse_exec("run {token}")
    with pytest.raises(TemplateError, match="must not be a placeholder"):
        parse_exec("{url} x")
    with pytest.raises(TemplateError, match="inside quotes"):
        check_shell("echo '{iid}'")
    assert check_shell('echo {iid} "literal"')


def test_config_refusals() -> None:
    with pytest.raises(WorkerConfigError, match="passes the router token variable"):
        parse_config(
            {"routers": {"r": {"urls": ["http://r:1"], "token_env": "T"}},
             "templates": {"t": {"command": "x", "pass_env": ["T"]}}}, "f",
        )  # fmt: skip
    with pytest.raises(WorkerConfigError, match="router URL 'http://r/;x' refused"):
        parse_config({"routers": {"r": {"urls": ["http://r/;x"]}}}, "f")
    with pytest.raises(WorkerConfigError, match="name 'a b' must match"):
        parse_config({"templates": {"a b": {"command": "x"}}}, "f")
    with pytest.raises(ValidationError, match="inside quotes"):
        CommandTemplate(command='echo "{iid}"', shell=True)


def test_resolution() -> None:
    cfg = parse_config(
        {"routers": {"pair": {"urls": ["http://a:1", "http://b:1"], "token_env": "T"}},
         "templates": {"restart": {"command": "x {iid}"}, "rollback": {"command": "y {iid}"}}}, "f",
    )  # fmt: skip
    r = resolve_router(cfg, RouterRef(routers=["http://b:1"]))
    assert r.name == "pair" and r.urls == ("http://b:1", "http://a:1") and r.token({"T": "s"}) == "s"
    assert resolve_router(cfg, RouterRef(name="pair")).urls == ("http://a:1", "http://b:1")
    with pytest.raises(Refused):
        resolve_router(cfg, RouterRef(routers=["http://a:1", "http://c:1"]))
    assert resolve_template(cfg, SupervisorRef(backend="command"))[0] == "restart"
    assert resolve_template(cfg, SupervisorRef(backend="command", template="rollback"))[0] == "rollback"
    assert resolve_template(cfg, SupervisorRef(backend="command"), name="rollback")[0] == "rollback"
    with pytest.raises(Refused, match="carries a command"):
        resolve_template(cfg, SupervisorRef(backend="command", command="x"))


def test_command_env_holds_only_what_the_template_needs() -> None:
    t = CommandTemplate(command="x", env={"A": "1"}, pass_env=["HOME", "MISSING"])
    env = command_env(t, "e0", "http://h:1", {"PATH": "/bin", "HOME": "/root", "NARWHAL_CONTROL_TOKEN": "s"})
    assert env == {"PATH": "/bin", "HOME": "/root", "A": "1", "NARWHAL_ENGINE_ID": "e0",
                   "NARWHAL_ENGINE_URL": "http://h:1"}  # fmt: skip


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_flags(p)
    add_connection_flags(p)
    return p.parse_args(list(argv))


def test_flags_over_the_file_and_a_changed_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "worker.json"
    path.write_text(json.dumps({"routers": {"a": {"urls": ["http://a:1"]}}}))
    args = _args("--config", str(path), "--router", "b=http://b:1,http://b:2", "--router-token-env", "b=TB",
                 "--template", "restart=run {iid}")  # fmt: skip
    s = WorkerSettings(args.config, flag_overrides(args))
    cfg = s.current()
    assert sorted(cfg.routers) == ["a", "b"] and cfg.routers["b"].token_env == "TB"
    assert cfg.templates["restart"].argv() == ("run", "{iid}")
    path.write_text(json.dumps({"routers": {"c": {"urls": ["http://c:1"]}}}))
    assert sorted(s.current().routers) == ["b", "c"]
    path.write_text("{not json")
    with pytest.raises(WorkerConfigError, match="not JSON"):
        s.current()  # fails closed until fixed
    with pytest.raises(WorkerConfigError, match="no --router x"):
        flag_overrides(_args("--router-token-env", "x=T"))


def test_temporal_security_from_the_sdk_environment_and_flags(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"CA")
    key = tmp_path / "api.key"
    key.write_text("k3y\n")
    env = {"TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(ca), "TEMPORAL_TLS_SERVER_NAME": "tmprl"}
    sec = security(_args(), env=env)
    assert (
        not isinstance(sec.tls, bool) and sec.tls.server_root_ca_cert == b"CA" and sec.tls.domain == "tmprl"
    )
    assert security(_args(), env={}) == Security(tls=False, api_key=None)
    api = security(_args("--api-key-file", str(key)), env={})
    assert api.api_key == "k3y" and api.tls is True and api.describe() == "TLS + API key"
    flagged = security(_args("--tls-ca-cert", str(ca), "--tls-server-name", "x"), env={})
    assert not isinstance(flagged.tls, bool) and flagged.tls.domain == "x"
    with pytest.raises(TemporalUnavailable, match="--tls-cert and --tls-key go together"):
        security(_args("--tls-cert", str(ca)), env={})
    with pytest.raises(TemporalUnavailable, match="--tls-ca-cert"):
        security(_args("--tls-ca-cert", str(tmp_path / "missing")), env={})


def test_the_routers_fleet_file_refuses_unsafe_engine_ids_and_urls_by_name() -> None:
    from router.config import ConfigError, parse_fleet

    for engine, why in (
        ({"iid": "x{url}", "url": "http://a"}, "engines[0].iid: engine id 'x{url}' refused"),
        (
            {"iid": "e0", "url": "http://a/;touch /tmp/m"},
            "engines[0].url: engine URL 'http://a/;touch /tmp/m'",
        ),
        ({"iid": "e0", "url": "file:///x"}, "the scheme must be http or https"),
    ):
        with pytest.raises(ConfigError) as err:
            parse_fleet({"model": "m", "engines": [engine]})
        assert why in str(err.value)
    ok = parse_fleet(
        {"model": "m", "engines": [{"iid": f"e{i}", "url": f"http://127.0.0.1:900{i}/"} for i in range(3)]}
    )
    assert [e.iid for e in ok.engines] == ["e0", "e1", "e2"] and ok.engines[0].url == "http://127.0.0.1:9000"
