"""Start ``narwhal-attest`` sidecars as real processes next to simulated engines (stopped by PID)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from narwhal_testing import loopback
from narwhal_testing.procs import Proc, ProcGroup, free_port, script, wait_http


@dataclass
class Sidecar:
    iid: str
    url: str  # base URL of the sidecar
    port: int
    proc: Proc

    @property
    def attestation_url(self) -> str:
        return self.url + "/v1/attestation"

    def health(self) -> httpx.Response:
        return loopback.get(self.url + "/health", timeout=5.0)


def write_contract(path: Path, contract: dict[str, Any]) -> Path:
    path.write_text(json.dumps(contract), encoding="utf-8")
    return path


def engine_pids(supervisor_url: str) -> dict[str, int]:
    doc = loopback.get(supervisor_url + "/engines", timeout=10.0).json()
    return {iid: int(e["pid"]) for iid, e in doc["engines"].items() if e.get("pid")}


def start_sidecar(
    group: ProcGroup,
    iid: str,
    engine_url: str,
    contract: Path,
    pid: int | None = None,
    port: int | None = None,
    wait_bound: bool = True,
    timeout: float = 30.0,
) -> Sidecar:
    """Start a sidecar for one engine; waits until it has bound the engine (``/health`` 200)."""
    port = port or free_port()
    args = [script("narwhal-attest"), "--engine-url", engine_url, "--contract", str(contract)]
    args += ["--host", "127.0.0.1", "--port", str(port), "--bind-interval", "0.1"]
    if pid is not None:
        args += ["--engine-pid", str(pid)]
    proc = group.start(f"attest-{iid}", args)
    side = Sidecar(iid, f"http://127.0.0.1:{port}", port, proc)
    if wait_bound:
        wait_http(side.url + "/health", timeout=timeout, proc=proc)
    return side


def restart_sidecar(group: ProcGroup, side: Sidecar, contract: Path, pid: int | None = None) -> Sidecar:
    """Stop the sidecar (by PID) and bind a new one on the same port: the runbook's step after a restart."""
    args = side.proc.args
    engine_url = args[args.index("--engine-url") + 1]
    side.proc.stop()
    return start_sidecar(group, side.iid, engine_url, contract, pid, side.port)
