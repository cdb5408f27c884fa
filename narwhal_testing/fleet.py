"""Test helpers for simulated fleets: real ``narwhal-engine-sim`` processes, fleet files, faults, stats,
and a real ``narwhal-supervisor``.

Faults (``set_fault(url, **faults)``, merged): ``health_fail``, ``hang``, ``slow_ms``, ``error_rate``,
``wrong_model``, ``kv_layout``, ``break_descriptor`` (True/"missing"/"garbled"), ``attestation``
("ok"/"broken"/"fail"), ``generation_fail``, ``stall_body`` (a buffered answer stops after half its
body until cleared). ``sim_requests(url)``: the completion requests the engine received (path,
``x_request_id``, body as sent). ``reset_faults(url)`` clears them.

Stats (``sim_stats(url)``): ``requests`` {prefill, decode, plain} (also flat at top level),
``active_streams``, ``cancelled_streams``, ``completed``, ``errors``, ``kv_pulls_served`` (producer:
blocks handed to a consumer), ``kv_pulls_refused`` (producer: pull refused), ``kv_pulls_done`` /
``kv_pulls_failed`` (consumer: decode legs whose KV pull succeeded / failed), ``engine_id``,
``process_start``, ``kv_layout``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.fleetgen import fleet_document, sim_command, supervisor_config
from narwhal_testing import loopback
from narwhal_testing.procs import BIN, Proc, ProcGroup, free_port, script, wait_http

# fleet-file settings for tests: a fast monitor and recovery sweeps (``write_fleet(..., extra=FAST)``)
FAST: dict[str, Any] = {
    "controller": {"monitor_interval_s": 0.2},
    "recovery": {"liveness_every": 2, "readmit_every": 2},
}


@dataclass
class SimEngine:
    iid: str
    url: str
    port: int
    role: str
    proc: Proc | None  # None when a supervisor owns the process
    model: str = "sim-model"


def default_roles(n: int) -> list[str]:
    """First half prefill, rest decode (a single engine is decode)."""
    n_prefill = n // 2
    return ["prefill" if i < n_prefill else "decode" for i in range(n)]


def start_sims(
    group: ProcGroup,
    n: int,
    model: str = "sim-model",
    roles: Sequence[str] | None = None,
    timeout: float = 30.0,
    first_index: int = 0,
    **sim_opts: Any,
) -> list[SimEngine]:
    """Start ``n`` simulated engines ``e<i>`` on free ports and wait until each answers /health."""
    roles = list(roles) if roles is not None else default_roles(n)
    if len(roles) != n:
        raise ValueError(f"{len(roles)} roles for {n} engines")
    sims: list[SimEngine] = []
    for i in range(n):
        iid = f"e{first_index + i}"
        port = free_port()
        proc = group.start(iid, sim_command(iid, port, model, **sim_opts))
        sims.append(SimEngine(iid, f"http://127.0.0.1:{port}", port, roles[i], proc, model))
    for sim in sims:
        wait_http(sim.url + "/health", timeout=timeout, proc=sim.proc)
    return sims


def restart_sim(group: ProcGroup, sim: SimEngine, timeout: float = 30.0, **sim_opts: Any) -> SimEngine:
    """Stop ``sim`` (by PID) and start a new process on the same port: a new engine id and process start."""
    if sim.proc is not None:
        sim.proc.stop()
    proc = group.start(sim.iid, sim_command(sim.iid, sim.port, sim.model, **sim_opts))
    wait_http(sim.url + "/health", timeout=timeout, proc=proc)
    sim.proc = proc
    return sim


def write_fleet(tmp_path: Path, sims: Sequence[SimEngine], name: str = "fleet.json", **kw: Any) -> Path:
    """Write a ``narwhal.fleet`` v2 file for ``sims``; ``kw`` go to ``fleet_document``."""
    kw.setdefault("model", sims[0].model if sims else "sim-model")
    kw.setdefault("state_path", str(tmp_path / "state.json"))
    doc = fleet_document([(s.iid, s.url, s.role) for s in sims], **kw)
    path = tmp_path / name
    path.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    return path


def set_fault(url: str, **faults: Any) -> dict[str, Any]:
    r = loopback.post(url.rstrip("/") + "/sim/faults", json=faults, timeout=5.0)
    r.raise_for_status()
    result: dict[str, Any] = r.json()
    return result


def reset_faults(url: str) -> dict[str, Any]:
    r = loopback.post(url.rstrip("/") + "/sim/faults/reset", timeout=5.0)
    r.raise_for_status()
    result: dict[str, Any] = r.json()
    return result


def sim_stats(url: str) -> dict[str, Any]:
    r = loopback.get(url.rstrip("/") + "/sim/stats", timeout=5.0)
    r.raise_for_status()
    result: dict[str, Any] = r.json()
    return result


def sim_requests(url: str) -> list[dict[str, Any]]:
    r = loopback.get(url.rstrip("/") + "/sim/requests", timeout=5.0)
    r.raise_for_status()
    rows: list[dict[str, Any]] = r.json()["requests"]
    return rows


async def aset_fault(url: str, **faults: Any) -> dict[str, Any]:
    async with loopback.async_client(timeout=5.0) as client:
        r = await client.post(url.rstrip("/") + "/sim/faults", json=faults)
        r.raise_for_status()
        result: dict[str, Any] = r.json()
        return result


async def asim_stats(url: str) -> dict[str, Any]:
    async with loopback.async_client(timeout=5.0) as client:
        r = await client.get(url.rstrip("/") + "/sim/stats")
        r.raise_for_status()
        result: dict[str, Any] = r.json()
        return result


def process_start(url: str) -> float:
    """The engine's live ``process_start_time_seconds`` from /metrics."""
    from fleet.managed import parse_process_start

    text = loopback.get(url.rstrip("/") + "/metrics", timeout=5.0).text
    value = parse_process_start(text)
    if value is None:
        raise ValueError(f"{url}/metrics has no process_start_time_seconds")
    return value


def start_supervisor(
    group: ProcGroup,
    tmp_path: Path,
    n: int,
    model: str = "sim-model",
    roles: Sequence[str] | None = None,
    health_timeout_s: float = 30.0,
    stop_grace_s: float = 5.0,
    timeout: float = 60.0,
    **sim_opts: Any,
) -> tuple[str, list[SimEngine]]:
    """Start a ``narwhal-supervisor`` owning ``n`` simulated engines; returns (supervisor URL, engines).

    The supervisor only starts listening after its engines answered /health, so this returns with
    the whole fleet up. The engines' ``proc`` is None: stop/restart them through the supervisor API.
    """
    roles = list(roles) if roles is not None else default_roles(n)
    ports = [free_port() for _ in range(n)]
    iids = [f"e{i}" for i in range(n)]
    cfg = supervisor_config(
        list(zip(iids, ports, strict=True)),
        model=model,
        health_timeout_s=health_timeout_s,
        stop_grace_s=stop_grace_s,
        **sim_opts,
    )
    cfg_path = tmp_path / "supervisor.json"
    cfg_path.write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    port = free_port()
    proc = group.start(
        "supervisor",
        [script("narwhal-supervisor"), "--config", str(cfg_path), "--host", "127.0.0.1", "--port", str(port)],
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", timeout=timeout, proc=proc)
    sims = [
        SimEngine(iid, f"http://127.0.0.1:{p}", p, role, None, model)
        for iid, p, role in zip(iids, ports, roles, strict=True)
    ]
    return url, sims


def vllm_router_command(
    prefills: Sequence[str], decodes: Sequence[str], port: int, log_dir: Path, *extra: str
) -> list[str]:
    """The Rust PD router ``vllm-router`` (PyPI) over our engines: NIXL connector, round robin."""
    cmd = [str(BIN / "vllm-router"), "--vllm-pd-disaggregation"]
    for url in prefills:
        cmd += ["--prefill", url]
    for url in decodes:
        cmd += ["--decode", url]
    return [
        *cmd,
        *("--kv-connector", "nixl", "--policy", "round_robin", "--host", "127.0.0.1", "--port", str(port)),
        *("--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())),
        *("--log-dir", str(log_dir / "vllm-router-logs")),
        *extra,
    ]
