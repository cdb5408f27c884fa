"""The separate control listener (control.port / --control-port) on a real narwhal-serve process."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import loopback
from tests.support.fleet import start_sims, write_fleet
from tests.support.procs import free_port, proc_group, script
from tests.support.router import RouterHandle, start_router

pytestmark = pytest.mark.integration

COMPLETION = {"model": "sim-model", "prompt": "hello", "max_tokens": 4}
DRAIN = {"engines": ["e0"], "deadline_s": 30}
TOKEN_ENV = "NARWHAL_CTL_TEST_TOKEN"


def _state(r: RouterHandle, iid: str = "e0") -> str:
    doc: dict[str, Any] = r.get("/narwhal/lifecycle", control=True).json()
    state: str = doc["engines"][iid]["state"]
    return state


def test_control_routes_only_on_the_control_listener(tmp_path: Path) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3)
        cport = free_port()
        fleet = write_fleet(tmp_path, sims, extra={"control": {"port": cport}})
        r = start_router(group, fleet, tmp_path, wait_ready=True)
        assert r.control_url == f"http://127.0.0.1:{cport}" != r.url

        # client listener: data plane and ops, no control API
        assert r.post("/v1/completions", COMPLETION).status_code == 200
        for path in ("/health", "/ready", "/metrics", "/v1/models"):
            assert r.get(path).status_code == 200, path
        drain = r.post("/narwhal/lifecycle/drain", DRAIN)
        assert drain.status_code == 404
        err = drain.json()["error"]
        assert err["message"] == "control API is served on the control listener"
        assert err["code"] == "control_listener_only" and str(cport) not in drain.text
        for path in ("/narwhal/lifecycle", "/narwhal/handoff", "/narwhal/openapi.json", "/narwhal/nope"):
            assert r.get(path).status_code == 404, path
        assert _state(r) == "active"  # the refused drain changed nothing

        # control listener: control API and ops, no data plane
        for path in ("/health", "/ready", "/metrics", "/narwhal/handoff"):
            assert r.get(path, control=True).status_code == 200, path
        completion = r.post("/v1/completions", COMPLETION, control=True)
        assert completion.status_code == 404 and completion.json()["error"]["type"] == "not_found"
        assert r.post("/v1/chat/completions", {}, control=True).status_code == 404
        assert r.get("/v1/models", control=True).status_code == 404
        drain = r.post("/narwhal/lifecycle/drain", DRAIN, control=True)
        assert drain.status_code == 200, drain.text
        assert drain.json()["engines"]["e0"]["draining"] is True
        assert _state(r) in ("draining", "drained")


def test_control_token_on_the_control_listener_and_flag_override(tmp_path: Path) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3)
        file_port, flag_port = free_port(), free_port()
        fleet = write_fleet(tmp_path, sims, extra={"control": {"port": file_port, "token_env": TOKEN_ENV}})
        r = start_router(
            group, fleet, tmp_path, wait_ready=True, control_port=flag_port, env={TOKEN_ENV: "s3cret"}
        )
        assert r.control_url.endswith(f":{flag_port}")  # --control-port overrides control.port
        with pytest.raises(httpx.ConnectError):
            loopback.get(f"http://127.0.0.1:{file_port}/health", timeout=2)

        good = {"authorization": "Bearer s3cret"}
        # the client listener answers 404 even with the right token, before authentication
        assert r.post("/narwhal/lifecycle/drain", DRAIN, headers=good).status_code == 404
        missing = r.post("/narwhal/lifecycle/drain", DRAIN, control=True)
        assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_token"
        wrong = r.post(
            "/narwhal/lifecycle/drain", DRAIN, control=True, headers={"authorization": "Bearer no"}
        )
        assert wrong.status_code == 403 and wrong.json()["error"]["code"] == "invalid_token"
        assert _state(r) == "active"
        ok = r.post("/narwhal/lifecycle/drain", DRAIN, control=True, headers=good)
        assert ok.status_code == 200, ok.text
        assert r.post("/v1/completions", COMPLETION, control=True, headers=good).status_code == 404
        assert r.post("/v1/completions", COMPLETION).status_code == 200  # e1/e2 still serve


def test_control_port_equal_to_the_client_port_exits_2(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.json"
    port = free_port()
    fleet.write_text(
        '{"model": "m", "engines": [{"iid": "e0", "url": "http://127.0.0.1:1"}], '
        f'"control": {{"port": {port}}}}}'
    )
    args = [script("narwhal-serve"), "--fleet", str(fleet), "--port", str(port)]
    args += ["--journal", str(tmp_path / "j.jsonl")]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "distinct ports" in done.stderr
