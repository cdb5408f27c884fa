"""Checks ``narwhal-restart start`` runs BEFORE starting a workflow (nothing is drained on refusal).

Refuses: routers that answer nothing, no router in control, unknown engines, an empty set, a wave
already held, engines not active, a rolling restart under ``whole_wave``, a partial wave, a
supervisor that does not answer or lacks engines, and engines whose URL cannot be resolved (needed
to see the newer process).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any

import httpx

from activities.router import NOT_CONTROLLING, holder_hint, parse_lifecycle
from workflows.models import DeadlinePolicy, FleetView, RestartMode, SupervisorBackend, fleet_slug


class PreflightError(Exception):
    """A refusal with an operator-facing message (CLI exit 2)."""


@dataclass
class StartRequest:
    routers: list[str]
    engines: list[str] | None = None
    mode: RestartMode | None = None
    fleet: str = ""
    supervisor: SupervisorBackend = "local"
    supervisor_url: str = ""
    restart_command: str = ""
    engine_urls: dict[str, str] = field(default_factory=dict)
    token_env: str = ""
    deadline_policy: DeadlinePolicy = "wait"


@dataclass
class Preflight:
    view: FleetView
    engines: list[str]
    mode: RestartMode
    fleet: str
    engine_urls: dict[str, str]
    notes: list[str] = field(default_factory=list)


def _headers(token_env: str) -> dict[str, str]:
    token = os.environ.get(token_env, "") if token_env else ""
    return {"Authorization": f"Bearer {token}"} if token else {}


async def _get(http: httpx.AsyncClient, url: str, token_env: str = "") -> tuple[int, Any]:
    r = await http.get(url, headers=_headers(token_env), timeout=5.0)
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, None


async def find_holder(http: httpx.AsyncClient, routers: list[str], token_env: str) -> FleetView:
    answers: list[str] = []
    holder: FleetView | None = None
    order = list(routers)
    for url in order:  # grows by the holder URL an active-active replica names
        try:
            status, body = await _get(http, f"{url}/narwhal/lifecycle", token_env)
        except httpx.HTTPError as exc:
            answers.append(f"{url}: no answer ({type(exc).__name__})")
            continue
        if status != 200 or not isinstance(body, dict) or body.get("schema") != "narwhal.lifecycle":
            answers.append(f"{url}: HTTP {status}, not a narwhal.lifecycle document")
            continue
        view = parse_lifecycle(body, url)
        answers.append(f"{url}: controls_fleet={view.controls_fleet}")
        if view.controls_fleet and holder is None:
            holder = view
        hint = holder_hint(body)
        if hint and hint not in order:
            order.append(hint)
    if holder is None:
        if not any("controls_fleet" in a for a in answers):
            raise PreflightError("no router answered the lifecycle API: " + "; ".join(answers))
        raise PreflightError(
            f"{NOT_CONTROLLING} (none of the routers is the lease holder): " + "; ".join(answers)
        )
    try:
        status, handoff = await _get(http, f"{holder.router_url}/narwhal/handoff", token_env)
        if status == 200 and isinstance(handoff, dict):
            roles = {str(k): str(v) for k, v in (handoff.get("roles") or {}).items()}
            holder = holder.model_copy(update={"roles": roles, "model": str(handoff.get("model", ""))})
    except httpx.HTTPError:
        pass
    return holder


def default_fleet(view: FleetView) -> str:
    digest = hashlib.sha256(",".join(sorted(view.engines)).encode()).hexdigest()[:8]
    return fleet_slug(f"{view.model or 'model'}-{len(view.engines)}e-{digest}")


async def _supervisor_urls(http: httpx.AsyncClient, req: StartRequest, engines: list[str]) -> dict[str, str]:
    if req.supervisor == "local":
        if not req.supervisor_url:
            raise PreflightError("--supervisor local needs --supervisor-url")
        try:
            status, body = await _get(http, f"{req.supervisor_url.rstrip('/')}/engines")
        except httpx.HTTPError as exc:
            raise PreflightError(
                f"supervisor {req.supervisor_url} does not answer ({type(exc).__name__})"
            ) from exc
        known = (body or {}).get("engines") if isinstance(body, dict) else None
        if status != 200 or not isinstance(known, dict):
            raise PreflightError(f"supervisor {req.supervisor_url}/engines answered HTTP {status}")
        missing = [i for i in engines if i not in known]
        if missing:
            raise PreflightError(f"supervisor does not manage engine(s): {', '.join(missing)}")
        return {i: str(known[i].get("url", "")).rstrip("/") for i in engines}
    if req.supervisor == "command" and not req.restart_command:
        raise PreflightError("--supervisor command needs --restart-command 'TEMPLATE' ({iid}, {url})")
    return {}


async def preflight(http: httpx.AsyncClient, req: StartRequest) -> Preflight:
    if not req.routers:
        raise PreflightError("give at least one --router URL")
    view = await find_holder(http, [u.rstrip("/") for u in req.routers], req.token_env)
    policy = view.engine_restart_policy
    mode: RestartMode = req.mode or ("wave" if policy == "whole_wave" else "rolling")
    if req.engines is not None:
        engines = [e for e in req.engines if e]
        if not engines:
            raise PreflightError("the engine set is empty")
        unknown = [e for e in engines if e not in view.engines]
        if unknown:
            raise PreflightError(
                f"unknown engine(s): {', '.join(unknown)} (router knows {', '.join(sorted(view.engines))})"
            )
    else:
        engines = sorted(view.engines)
    if not engines:
        raise PreflightError("the router reports no engines")
    if mode == "rolling" and policy == "whole_wave":
        raise PreflightError("engine_restart_policy is whole_wave: use --mode wave")
    if mode == "wave" and sorted(engines) != sorted(view.engines):
        raise PreflightError("a whole-wave restart covers every engine; drop --engines or use --mode rolling")
    if view.wave_active:
        raise PreflightError(
            f"a wave is already held ({view.wave_id}): repair or readmit it before restarting"
        )
    check = sorted(view.engines) if mode == "wave" else engines
    not_active = {
        i: view.engines[i]
        for i in check
        if view.engines[i].state != "active" or not view.engines[i].accepts_new
    }
    if not_active:
        detail = ", ".join(
            f"{i} ({e.state}{': ' + e.error if e.error else ''})" for i, e in not_active.items()
        )
        raise PreflightError(f"engine(s) not active: {detail}")
    urls = await _supervisor_urls(http, req, engines)
    urls.update({k: v.rstrip("/") for k, v in req.engine_urls.items() if v})
    missing = [i for i in engines if not urls.get(i)]
    if missing:
        raise PreflightError(f"no URL for engine(s) {', '.join(missing)}: pass --engine-url IID=URL")
    fleet = req.fleet or default_fleet(view)
    return Preflight(view=view, engines=engines, mode=mode, fleet=fleet, engine_urls=urls)
