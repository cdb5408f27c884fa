"""Start ``narwhal-serve`` as a real process for integration tests (stopped by PID via the group)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from narwhal_testing import loopback
from narwhal_testing.metrics import Samples, parse_samples
from narwhal_testing.procs import Proc, ProcGroup, free_port, script, wait_http


@dataclass
class RouterHandle:
    url: str
    port: int
    proc: Proc
    journal: Path
    control_url: str = ""  # the control listener (control.port / --control-port); default: url

    def __post_init__(self) -> None:
        self.control_url = self.control_url or self.url

    def get(self, path: str, timeout: float = 5.0, control: bool = False) -> httpx.Response:
        return loopback.get((self.control_url if control else self.url) + path, timeout=timeout)

    def post(
        self, path: str, body: Any = None, timeout: float = 30.0, control: bool = False, **kw: Any
    ) -> httpx.Response:
        base = self.control_url if control else self.url
        return loopback.post(base + path, json=body, timeout=timeout, **kw)

    def metrics(self) -> Samples:
        """``/metrics`` as {"name{labels}": value}, read with prometheus_client (labels any order)."""
        return parse_samples(self.get("/metrics").text)

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
    control_port: int | None = None,
    wait: bool = True,
) -> RouterHandle:
    """Start a router on a free loopback port, journal in ``tmp_path``; waits for ``/health`` (or /ready)
    unless ``wait`` is False (the caller waits on the states it needs: several routers started at once).

    ``control_port`` passes ``--control-port``; without it a ``control.port`` in the fleet file is
    used. ``RouterHandle.control_url`` is the control listener (or ``url`` when there is none).
    """
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
    if control_port is not None:
        args += ["--control-port", str(control_port)]
    else:
        control_port = _fleet_control_port(fleet_path)
    proc = group.start(name, args, env=env)
    url = f"http://127.0.0.1:{port}"
    control_url = f"http://127.0.0.1:{control_port}" if control_port else url
    if wait:
        wait_http(control_url + ("/ready" if wait_ready else "/health"), timeout=timeout, proc=proc)
    return RouterHandle(url, port, proc, journal, control_url)


def _fleet_control_port(fleet_path: Path) -> int:
    try:
        doc = json.loads(fleet_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0  # YAML or unreadable: the router reports it
    control = doc.get("control") if isinstance(doc, dict) else None
    port = control.get("port", 0) if isinstance(control, dict) else 0
    return port if isinstance(port, int) else 0
