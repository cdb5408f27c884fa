"""Builders for simulated-engine commands, ``narwhal.fleet`` v2 documents and supervisor configs."""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fleet.contract import DEFAULT_CONTRACT

DEFAULT_SLO = {"ttft_s": 2.0, "tpot_s": 0.1}


def sim_binary() -> str:
    """The venv's ``narwhal-engine-sim`` console script (next to the running interpreter)."""
    return str(Path(sys.executable).parent / "narwhal-engine-sim")


def sim_command(
    iid: str, port: int, model: str = "sim-model", host: str = "127.0.0.1", **opts: Any
) -> list[str]:
    """Command line of one simulated engine; ``opts`` become flags (``itl_ms=1`` → ``--itl-ms 1``;
    ``True`` → a bare flag: ``no_attestation=True`` → ``--no-attestation``)."""
    cmd = [sim_binary(), "--host", host, "--port", str(port), "--model", model, "--iid", iid]
    return cmd + sim_flags(opts)


def sim_flags(opts: Mapping[str, Any]) -> list[str]:
    """Simulator options as flags (``itl_ms=1`` → ``--itl-ms 1``; ``True`` → a bare flag)."""
    cmd: list[str] = []
    for key, value in opts.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        cmd += [flag] if value is True else [flag, str(value)]
    return cmd


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def fleet_document(
    engines: Sequence[tuple[str, str, str]],
    model: str,
    policy: str = "individual",
    state_path: str | Path = "runs/state.json",
    extra: Mapping[str, Any] | None = None,
    contract: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``narwhal.fleet`` v2 document for ``(iid, url, role)`` engines (deep-merges ``extra``)."""
    doc: dict[str, Any] = {
        "schema": "narwhal.fleet",
        "schema_version": 2,
        "model": model,
        "engines": [
            {
                "iid": iid,
                "url": url.rstrip("/"),
                "role": role,
                "attestation_url": url.rstrip("/") + "/v1/attestation",
            }
            for iid, url, role in engines
        ],
        "slo": dict(DEFAULT_SLO),
        "engine_contract": dict(DEFAULT_CONTRACT if contract is None else contract),
        "recovery": {"state_path": str(state_path), "engine_restart_policy": policy},
    }
    return _merge(doc, extra or {})


def supervisor_config(
    engines: Sequence[tuple[str, int]],
    model: str = "sim-model",
    health_timeout_s: float = 30.0,
    stop_grace_s: float = 5.0,
    host: str = "127.0.0.1",
    builds: Mapping[str, Mapping[str, Any]] | None = None,
    **sim_opts: Any,
) -> dict[str, Any]:
    """Supervisor config running one simulated engine per ``(iid, port)``; ``builds`` names other
    simulator builds by their options (``{"degraded": {"error_rate": 0.2}}`` → ``--error-rate 0.2``)."""
    return {
        "builds": {name: sim_flags(opts) for name, opts in (builds or {}).items()},
        "engines": [
            {
                "iid": iid,
                "url": f"http://{host}:{port}",
                "command": sim_command(iid, port, model, host=host, **sim_opts),
            }
            for iid, port in engines
        ],
        "health_timeout_s": health_timeout_s,
        "stop_grace_s": stop_grace_s,
    }
