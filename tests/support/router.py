"""Start ``narwhal-serve`` as a real process for integration tests (stopped by PID via the group)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.procs import Proc, ProcGroup, free_port, script, wait_http


@dataclass
class RouterHandle:
    url: str
    port: int
    proc: Proc
    journal: Path

    def get(self, path: str, timeout: float = 5.0) -> httpx.Response:
        return httpx.get(self.url + path, timeout=timeout)

    def post(self, path: str, body: Any = None, timeout: float = 30.0, **kw: Any) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=timeout, **kw)

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as {"name{labels}": value} (comments dropped)."""
        out: dict[str, float] = {}
        for line in self.get("/metrics").text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def journal_rows(self) -> list[dict[str, Any]]:
        if not self.journal.exists():
            return []
        return [json.loads(line) for line in self.journal.read_text().splitlines() if line.strip()]


def start_router(
    group: ProcGroup,
    fleet_path: Path,
    tmp_path: Path,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    name: str = "router",
    port: int | None = None,
    wait_ready: bool = False,
    timeout: float = 30.0,
) -> RouterHandle:
    """Start a router on a free loopback port, journal in ``tmp_path``; waits for ``/health`` (or /ready)."""
    port = port or free_port()
    journal = tmp_path / f"{name}.journal.jsonl"
    args = [
        script("narwhal-serve"),
        "--fleet",
        str(fleet_path),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--journal",
        str(journal),
        *extra_args,
    ]
    proc = group.start(name, args, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + ("/ready" if wait_ready else "/health"), timeout=timeout, proc=proc)
    return RouterHandle(url, port, proc, journal)
