"""narwhal-attest: contract loading, binding rules, the /proc reader, and the app over a mock engine."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp.test_utils import TestClient, TestServer

from fleet.attest import proc
from fleet.attest.binding import ContractError, Observation, bind_problem, change_problem, load_contract
from fleet.attest.cli import main
from fleet.attest.server import EngineReader, Settings, Sidecar
from router.attestation import verify_attestation
from router.config import CONTRACT_FIELDS

EXAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "peer_examples"
CONTRACT: dict[str, Any] = json.loads((EXAMPLES / "attestation.json").read_text())["contract"]


def test_contract_from_a_bare_object_a_fleet_file_and_legacy_names(tmp_path: Path) -> None:
    bare = tmp_path / "c.json"
    bare.write_text(json.dumps(CONTRACT))
    assert load_contract(bare) == CONTRACT
    fleet = tmp_path / "fleet.json"
    legacy = {("vllm_version" if k == "engine_version" else k): v for k, v in CONTRACT.items()}
    fleet.write_text(json.dumps({"schema": "narwhal.fleet", "engine_contract": legacy}))
    assert load_contract(fleet) == CONTRACT


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "cannot read contract file"),
        ("{", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        (json.dumps({"schema": "narwhal.fleet"}), "has no engine_contract"),
        (json.dumps({**CONTRACT, "colour": "red"}), "unknown contract field colour"),
        (json.dumps({"engine_version": "1"}), "incomplete engine_contract, missing image_digest"),
    ],
)
def test_unusable_contract_files_name_the_problem(tmp_path: Path, content: str | None, needle: str) -> None:
    path = tmp_path / "c.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ContractError, match=needle) as err:
        load_contract(path)
    assert str(path) in str(err.value)


def test_cli_exits_2_for_an_unknown_pid_and_a_bad_contract(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "c.json"
    good.write_text(json.dumps(CONTRACT))
    base = ["--engine-url", "http://127.0.0.1:1", "--contract", str(good)]
    assert main([*base, "--engine-pid", str(2**22 + 5)]) == 2
    assert "no process with PID" in capsys.readouterr().err
    assert main(["--engine-url", "ftp://x", "--contract", str(good)]) == 2
    assert "is not an http(s) URL" in capsys.readouterr().err
    assert main([*base, "--timeout", "nan"]) == 2
    assert "--timeout must be finite" in capsys.readouterr().err
    good.chmod(0)
    if os.geteuid() != 0:  # root reads it anyway
        assert main(base) == 2
        assert "cannot read contract file" in capsys.readouterr().err


def test_proc_start_time_and_redacted_cmdline(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("cpu 1 2 3\nbtime 1700000000\n")
    pid_dir = tmp_path / "42"
    pid_dir.mkdir()
    rest = " ".join(["S"] + ["0"] * 18 + [str(100 * 7)] + ["0"] * 10)
    (pid_dir / "stat").write_text(f"42 (vllm serve (x)) {rest}\n")
    ticks = os.sysconf("SC_CLK_TCK")
    assert proc.start_time(42, tmp_path) == 1700000000 + 700 / ticks
    (pid_dir / "cmdline").write_bytes(b"vllm\0serve\0m\0--api-key\0s3cret\0--hf-token=abc\0--port\x008000\0")
    assert proc.cmdline(42, tmp_path) == [
        "vllm", "serve", "m", "--api-key", "<redacted>", "--hf-token=<redacted>", "--port", "8000"
    ]  # fmt: skip
    with pytest.raises(proc.ProcessGone):
        proc.start_time(43, tmp_path)
    (pid_dir / "stat").write_text(f"42 (x) Z {rest[2:]}\n")
    with pytest.raises(proc.ProcessGone, match="exited"):
        proc.start_time(42, tmp_path)
    me = proc.start_time(os.getpid())  # the real /proc: this process started before now
    import time

    assert 0 < time.time() - me < 24 * 3600


def test_port_problem_reads_the_pids_sockets_against_the_listening_ones(tmp_path: Path) -> None:
    pid_dir = tmp_path / "42"
    (pid_dir / "fd").mkdir(parents=True)
    (pid_dir / "net").mkdir()
    head = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    )
    (pid_dir / "net" / "tcp").write_text(
        head
        + "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000 0 111 1\n"
        + "   1: 0100007F:1F91 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1000 0 222 1\n"
    )
    (pid_dir / "net" / "tcp6").write_text(
        head + "   0: 00000000000000000000000000000000:1F92 00000000000000000000000000000000:0000 0A "
        "00000000:00000000 00:00000000 00000000  1000 0 333 1\n"
    )
    os.symlink("socket:[111]", pid_dir / "fd" / "3")
    os.symlink("socket:[333]", pid_dir / "fd" / "4")
    os.symlink("/dev/null", pid_dir / "fd" / "0")
    assert proc.socket_inodes(42, tmp_path) == {111, 333}
    assert proc.listening_inodes(42, 8080, tmp_path) == {111}
    assert proc.listening_inodes(42, 8081, tmp_path) == set()  # connected, not listening
    assert proc.listening_inodes(42, 8082, tmp_path) == {333}  # IPv6
    assert proc.port_problem(42, 8080, tmp_path) == "" == proc.port_problem(42, 8082, tmp_path)
    assert proc.port_problem(42, 8081, tmp_path) == (
        "PID 42 holds no socket listening on port 8081 (the engine URL's port): "
        "--engine-pid does not name the engine process"
    )
    with pytest.raises(proc.ProcessGone):
        proc.port_problem(43, 8080, tmp_path)


def test_port_problem_on_the_real_proc() -> None:
    import socket
    import subprocess

    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        assert proc.port_problem(os.getpid(), port) == ""
        other = subprocess.Popen(["sleep", "30"])
        try:
            assert "does not name the engine process" in proc.port_problem(other.pid, port)
        finally:
            other.kill()
            other.wait()
    assert "holds no socket listening on port" in proc.port_problem(os.getpid(), port)  # closed


def test_binding_rules() -> None:
    obs = Observation(CONTRACT["engine_version"], 100.5, ("m",), pid_start=100.0)
    assert bind_problem(obs, CONTRACT, 7, 60.0) == ""
    assert "engine reports '9'" in bind_problem(Observation("9", 100.5, ("m",)), CONTRACT, None, 60)
    assert "lists no model" in bind_problem(Observation(obs.version, 1.0), CONTRACT, None, 60)
    older = Observation(obs.version, 50.0, ("m",), pid_start=100.0)
    assert "does not name the engine process" in bind_problem(older, CONTRACT, 7, 60.0)
    assert change_problem(obs, obs, 7) == ""
    assert "engine process changed" in change_problem(obs, Observation(obs.version, 200.0, (), 100.0), 7)
    assert "PID 7 is now another process" in change_problem(
        obs, Observation(obs.version, 100.5, (), 300.0), 7
    )


class FakeEngine:
    def __init__(self) -> None:
        self.version = CONTRACT["engine_version"]
        self.start = 1_800_000_000.25
        self.up = True

    def handler(self, request: httpx.Request) -> httpx.Response:
        if not self.up:
            raise httpx.ConnectError("refused", request=request)
        if request.url.path == "/version":
            return httpx.Response(200, json={"version": self.version})
        if request.url.path == "/metrics":
            return httpx.Response(200, text=f"# TYPE x gauge\nprocess_start_time_seconds {self.start!r}\n")
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "m"}]})
        return httpx.Response(404)


async def test_sidecar_binds_serves_and_refuses_a_changed_process() -> None:
    engine = FakeEngine()
    engine.up = False
    settings = Settings(engine_url="http://engine.test", contract=dict(CONTRACT), bind_interval_s=0.01)
    reader = EngineReader(settings, transport=httpx.MockTransport(engine.handler))
    sidecar = Sidecar(settings, reader, wall=lambda: 1.0)
    sidecar._on_startup = _no_bind_loop  # type: ignore[method-assign]  # bind by hand below
    async with TestClient(TestServer(sidecar.app())) as client:
        resp = await client.get("/v1/attestation")
        assert resp.status == 503
        assert (await resp.json())["status"] == "unbound"
        assert not await sidecar.try_bind()
        assert "not bound yet: engine /version unreachable: ConnectError" in sidecar.reason
        engine.up = True
        assert await sidecar.try_bind()

        doc = await (await client.get("/v1/attestation")).json()
        assert verify_attestation(doc, CONTRACT, engine.version, engine.start) == []
        assert set(doc["sources"]) == {k for k in CONTRACT_FIELDS if CONTRACT[k] not in (None, "")}
        assert doc["launch"] == {"models": ["m"]}
        assert (await client.get("/health")).status == 200
        process = await (await client.get("/v1/process")).json()
        assert process["process_start_time_seconds"] == engine.start and process["source"] == "metrics"

        engine.up = False  # unreachable: refused for now, not latched
        resp = await client.get("/v1/attestation")
        assert resp.status == 503 and (await resp.json())["status"] == "engine_unreachable"
        engine.up = True
        assert (await client.get("/v1/attestation")).status == 200

        engine.start += 30.0  # restarted behind the sidecar's back: latched for good
        for path in ("/v1/attestation", "/health", "/v1/process"):
            resp = await client.get(path)
            body = await resp.json()
            assert resp.status == 503 and body["status"] == "changed"
            assert "engine process changed" in body["error"]["message"]
        engine.start -= 30.0
        assert (await client.get("/v1/attestation")).status == 503  # even if it looked the same again


async def _no_bind_loop(_: Any) -> None:
    return None


async def test_contract_version_mismatch_never_binds() -> None:
    engine = FakeEngine()
    engine.version = "other"
    settings = Settings(engine_url="http://engine.test", contract=dict(CONTRACT))
    sidecar = Sidecar(settings, EngineReader(settings, transport=httpx.MockTransport(engine.handler)))
    assert not await sidecar.try_bind()
    assert sidecar.status == "unbound" and "contract engine_version" in sidecar.reason
    await sidecar.reader.close()


def test_docs_vllm_fleet_file_and_sidecar_flags_are_real() -> None:
    import re

    from fleet.attest.cli import build_parser
    from router.config import parse_fleet

    text = (Path(__file__).resolve().parents[2] / "docs" / "vllm.md").read_text(encoding="utf-8")
    block = re.search(r"## 4\. The fleet file\n\n```json\n(.*?)```", text, re.DOTALL)
    assert block is not None
    doc = json.loads(block.group(1))
    doc["engine_contract"] = dict(CONTRACT)
    cfg = parse_fleet(doc)
    assert cfg.engines[0].attestation_url.endswith(":8101/v1/attestation")
    flags = {a for action in build_parser()._actions for a in action.option_strings}
    for used in set(re.findall(r"narwhal-attest[^`]*?(--[a-z-]+)", text, re.DOTALL)) | {
        "--engine-url", "--engine-pid", "--contract", "--host", "--port", "--bind-interval"
    }:  # fmt: skip
        assert used in flags, used
