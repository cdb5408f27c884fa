"""Checks ``narwhal-restart start`` runs BEFORE starting a workflow (nothing is drained on refusal).

Refuses: routers that answer nothing, no router in control, unknown engines, an empty set, a wave
already held, engines not active, a rolling restart under ``whole_wave``, a partial wave, a
supervisor that does not answer or lacks engines, and engines whose URL cannot be resolved (needed
to see the newer process).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from activities.documents import (
    KNOWN_ROLES,
    DocumentError,
    fleet_file_urls,
    handoff_roles,
    lifecycle_document,
    target_urls,
)
from activities.router import NOT_CONTROLLING, holder_hint, view_of
from narwhal_models.restart import DeadlinePolicy, FleetView, RestartMode, SupervisorBackend, fleet_slug
from router.ids import UnsafeValue, check_engine_id, check_engine_url


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
    restart_template: str = "restart"
    engine_urls: dict[str, str] = field(default_factory=dict)
    fleet_file: str = ""
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
        if status != 200:
            answers.append(f"{url}: HTTP {status}, not a narwhal.lifecycle document")
            continue
        try:
            view = view_of(lifecycle_document(body, f"{url}/narwhal/lifecycle"), url)
        except DocumentError as exc:
            answers.append(str(exc))
            continue
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
    where = f"{holder.router_url}/narwhal/handoff"
    try:
        status, handoff = await _get(http, where, token_env)
    except httpx.HTTPError as exc:
        return holder.model_copy(update={"roles_error": f"{where}: no answer ({type(exc).__name__})"})
    if status != 200:
        return holder.model_copy(update={"roles_error": f"{where} answered HTTP {status}"})
    try:
        h = handoff_roles(handoff, where)
    except DocumentError as exc:
        return holder.model_copy(update={"roles_error": str(exc)})
    return holder.model_copy(update={"roles": dict(h.roles), "model": h.model})


async def router_targets(http: httpx.AsyncClient, router: str, token_env: str) -> tuple[dict[str, str], str]:
    """Engine base URLs from ``GET /narwhal/targets``; (urls, note) — the note says why none came."""
    where = f"{router}/narwhal/targets"
    try:
        status, body = await _get(http, where, token_env)
    except httpx.HTTPError as exc:
        return {}, f"{where}: no answer ({type(exc).__name__})"
    if status != 200:
        return {}, f"{where} answered HTTP {status}"
    try:
        return target_urls(body, where), ""
    except DocumentError as exc:
        raise PreflightError(str(exc)) from None


def fleet_file_engine_urls(path: str) -> dict[str, str]:
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise PreflightError(f"--fleet-file {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise PreflightError(f"--fleet-file {path}: not JSON ({exc})") from None
    try:
        return fleet_file_urls(doc, f"--fleet-file {path}")
    except DocumentError as exc:
        raise PreflightError(str(exc)) from None


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
    if req.supervisor == "command" and not req.restart_template:
        raise PreflightError("--supervisor command needs --restart-template NAME (a template of the worker)")
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
    if mode == "rolling":
        odd = {
            i: view.roles.get(i, "(missing)") for i in view.engines if view.roles.get(i) not in KNOWN_ROLES
        }
        if view.roles_error or odd:
            why = view.roles_error or ", ".join(f"{i}={r}" for i, r in sorted(odd.items()))
            raise PreflightError(
                f"role safety: cannot tell which engines serve prefill and decode ({why}); "
                "a rolling restart could drain the last engine of a role"
            )
    urls, notes = await engine_urls(http, req, view.router_url, engines)
    fleet = req.fleet or default_fleet(view)
    return Preflight(view=view, engines=engines, mode=mode, fleet=fleet, engine_urls=urls, notes=notes)


async def engine_urls(
    http: httpx.AsyncClient, req: StartRequest, router: str, engines: list[str]
) -> tuple[dict[str, str], list[str]]:
    """Every engine's base URL (to watch its process start; ``{url}`` in a restart command).

    Sources, later ones win: ``--fleet-file`` (else the router's ``GET /narwhal/targets``), the
    local supervisor's engine list, then ``--engine-url IID=URL`` overrides.
    """
    notes: list[str] = []
    if req.fleet_file:
        urls = fleet_file_engine_urls(req.fleet_file)
        source = f"--fleet-file {req.fleet_file}"
    else:
        urls, why = await router_targets(http, router, req.token_env)
        source = f"{router}/narwhal/targets"
        if why:
            notes.append(f"no engine addresses from the router ({why})")
    urls.update(await _supervisor_urls(http, req, engines))
    try:
        urls.update({check_engine_id(k, "--engine-url"): check_engine_url(v, f"--engine-url {k}")
                     for k, v in req.engine_urls.items() if v})  # fmt: skip
    except UnsafeValue as exc:
        raise PreflightError(str(exc)) from None
    missing = [i for i in engines if not urls.get(i)]
    if missing:
        hint = "; ".join(notes) or f"{source} does not list them"
        raise PreflightError(
            f"no URL for engine(s) {', '.join(missing)} ({hint}): pass --fleet-file PATH or --engine-url IID=URL"
        )
    return {i: urls[i] for i in engines}, notes
