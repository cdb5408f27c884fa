"""What the sidecar binds to and when a binding no longer holds. Pure: no I/O.

At start the sidecar *binds* to the engine process it finds: the engine's ``/version``, its
``process_start_time_seconds`` (``/metrics``) and, with ``--engine-pid``, the start time of that PID
from ``/proc`` (a PID that does not hold a socket listening on the engine's port is refused:
``proc.port_problem``). From then on every answer re-reads the live values; once they differ from the bound
ones the binding is *broken* for good (latched): the sidecar answers 503 and never serves an
attestation of a process it did not bind. A restarted engine needs a restarted (re-bound) sidecar.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router.attestation import build_attestation
from router.config import CONTRACT_FIELDS, LEGACY_CONTRACT_NAMES
from router.engines.identity import same_process

PID_START_SLACK_S = 1.0  # the engine reports its start a little after the kernel's (imports, clocks)
SIDECAR = "narwhal-attest"


class ContractError(ValueError):
    """The contract file cannot be used; the message names the file and the problem."""


def parse_contract(data: Any, source: str) -> dict[str, Any]:
    """A complete ``engine_contract`` from a bare contract object or a ``narwhal.fleet`` file."""
    if isinstance(data, dict) and data.get("schema") == "narwhal.fleet":
        data = data.get("engine_contract")
        if data is None:
            raise ContractError(f"{source}: the fleet file has no engine_contract")
    if not isinstance(data, dict):
        raise ContractError(f"{source}: the contract must be a JSON object")
    contract: dict[str, Any] = {}
    for key, value in data.items():
        name = LEGACY_CONTRACT_NAMES.get(key, key)
        if name not in CONTRACT_FIELDS:
            raise ContractError(f"{source}: unknown contract field {key}")
        contract[name] = value
    missing = [f for f in CONTRACT_FIELDS if f not in contract]
    if missing:
        raise ContractError(f"{source}: incomplete engine_contract, missing {', '.join(missing)}")
    return contract


def load_contract(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ContractError(f"{p}: cannot read contract file: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ContractError(f"{p}: contract file is not UTF-8 text") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ContractError(f"{p}: not valid JSON: {exc}") from None
    return parse_contract(data, str(p))


@dataclass(frozen=True)
class Observation:
    """One look at the engine."""

    version: str
    process_start: float  # the engine's own process_start_time_seconds
    models: tuple[str, ...] = ()
    pid_start: float | None = None  # /proc start time of --engine-pid


def sources_for(contract: dict[str, Any]) -> dict[str, str]:
    """Provenance: ``engine_version`` is checked against ``/version``; the rest is the operator's file."""
    return {
        key: f"{SIDECAR}:/version" if key == "engine_version" else f"{SIDECAR}:contract-file"
        for key, value in contract.items()
        if value is not None and value != ""
    }


def bind_problem(obs: Observation, contract: dict[str, Any], pid: int | None, max_skew_s: float) -> str:
    """Why ``obs`` cannot be bound ("" = it can)."""
    want = contract.get("engine_version")
    if want is not None and want != obs.version:
        return f"contract engine_version {want!r} but the engine reports {obs.version!r} in /version"
    if not obs.models:
        return "the engine lists no model in /v1/models"
    if pid is not None and obs.pid_start is not None:
        skew = obs.process_start - obs.pid_start
        if skew < -PID_START_SLACK_S or skew > max_skew_s:
            return (
                f"the engine reports process start {obs.process_start!r} but PID {pid} started at "
                f"{obs.pid_start!r}: --engine-pid does not name the engine process"
            )
    return ""


def change_problem(bound: Observation, now: Observation, pid: int | None) -> str:
    """Why the live engine is no longer the bound process ("" = still the same)."""
    if pid is not None and now.pid_start is not None and bound.pid_start is not None:
        if abs(now.pid_start - bound.pid_start) > 1e-3:
            return f"PID {pid} is now another process (started {now.pid_start!r}, bound {bound.pid_start!r})"
    if not same_process(now.process_start, bound.process_start):
        return (
            f"the engine process changed since {SIDECAR} bound it (process start {bound.process_start!r}"
            f" -> {now.process_start!r}); restart {SIDECAR} to bind the new process"
        )
    if now.version != bound.version:
        return f"the engine version changed since {SIDECAR} bound it ({bound.version!r} -> {now.version!r})"
    return ""


def launch_record(obs: Observation, args: list[str] | None) -> dict[str, Any]:
    """The launch record attested with the contract: served models and (with a PID) the command line."""
    launch: dict[str, Any] = {"models": list(obs.models)}
    if args is not None:
        launch["args"] = args
    return launch


def attestation_for(obs: Observation, contract: dict[str, Any], args: list[str] | None) -> dict[str, Any]:
    return build_attestation(
        contract, sources_for(contract), obs.version, obs.process_start, launch=launch_record(obs, args)
    )
