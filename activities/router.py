"""Lifecycle API client + activities (spec §4–§6, runbooks §13).

- One ``httpx.AsyncClient`` per worker, injected (tests pass an ``httpx.MockTransport``).
- Follows the lease holder: the HA pair's URLs are all configured (an active-active replica's
  document also names the holder's control URL in ``replicas.holder_url``: any one replica will do); a router that answers 503
  "this router does not control the fleet" (or "router control was fenced …"), or does not answer
  at all, is skipped, and the holder is the one whose ``/narwhal/lifecycle`` says
  ``router.controls_fleet: true``. No holder → retryable ``RouterUnavailable``.
- Idempotent: a retried drain that meets 409 "lifecycle action already active" for engines that are
  held with their identity recorded is success; a retried readmit that meets 409 for engines already
  ``active`` with a ``new_process_start`` newer than the drain record is success.
- Waits heartbeat (``wait_ready_to_stop``) or poll by retry (``confirm_active``, whose attempts
  heartbeat too: an attempt lost with a killed worker is retried after ``heartbeat_timeout``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import errors
from activities.documents import (
    DocumentError,
    LifecycleDocument,
    LifecycleEngine,
    handoff_roles,
    lifecycle_document,
)
from activities.heartbeat import heartbeating
from workflows.models import (
    ConfirmRequest,
    DrainOutcome,
    DrainRequest,
    EngineView,
    FleetView,
    ReadmitOutcome,
    ReadmitRequest,
    RouterRef,
    StopWait,
    StopWaitRequest,
)

NOT_CONTROLLING = "this router does not control the fleet"
FENCED = "router control was fenced"
ALREADY_ACTIVE = "lifecycle action already active"
HELD_STATES = frozenset({"draining", "drained", "deadline_exceeded"})


def parse_lifecycle(doc: object, router_url: str = "") -> FleetView:
    """`narwhal.lifecycle` v1 → ``FleetView`` (the fields the workflows use). A document without
    them is a retryable ``RouterUnavailable`` naming the missing or malformed field."""
    try:
        d = lifecycle_document(doc, router_url)
    except DocumentError as exc:
        raise errors.router_unavailable(str(exc)) from None
    return view_of(d, router_url)


def view_of(d: LifecycleDocument, router_url: str) -> FleetView:
    engines = {iid: _engine_view(e) for iid, e in d.engines.items()}
    return FleetView(
        router_url=router_url, controls_fleet=d.router.controls_fleet, ready=d.router.ready,
        wave_id=d.wave.id, wave_active=d.wave.active, wave_ready_to_stop=d.wave.ready_to_stop,
        engine_restart_policy=d.engine_restart_policy, engines=engines,
    )  # fmt: skip


def _engine_view(e: LifecycleEngine) -> EngineView:
    return EngineView(
        state=e.state, draining=e.draining, accepts_new=e.accepts_new, ready_to_stop=e.ready_to_stop,
        resident=e.resident.prefill + e.resident.decode, old_process_start=e.old_process_start,
        new_process_start=e.new_process_start, restart_required=e.restart_required,
        wave_id=e.wave_id, checks=list(e.checks), error=e.error,
        build=e.build.text() if e.build is not None else "",
    )  # fmt: skip


def holder_hint(body: Any) -> str:
    """An active-active replica's lifecycle document names the lease holder's control URL."""
    replicas = body.get("replicas") if isinstance(body, dict) else None
    url = replicas.get("holder_url") if isinstance(replicas, dict) else None
    return url.rstrip("/") if isinstance(url, str) and url.startswith(("http://", "https://")) else ""


def _error_of(body: Any) -> str:
    return str(body.get("error", "")) if isinstance(body, dict) else ""


def _not_controlling(status: int, body: Any) -> bool:
    err = _error_of(body)
    return status == 503 and (err == NOT_CONTROLLING or err.startswith(FENCED))


class LifecycleClient:
    """Talks to whichever configured router holds the lease."""

    def __init__(self, http: httpx.AsyncClient, env: Mapping[str, str] | None = None) -> None:
        self.http = http
        self.env = env if env is not None else os.environ
        self._holder: dict[tuple[str, ...], str] = {}

    def headers(self, ref: RouterRef) -> dict[str, str]:
        if not ref.token_env:
            return {}
        token = self.env.get(ref.token_env, "")
        if not token:
            raise errors.unauthorized(f"control token variable {ref.token_env} is not set on the worker")
        return {"Authorization": f"Bearer {token}"}

    async def _request(self, ref: RouterRef, method: str, url: str, body: Any = None) -> tuple[int, Any]:
        r = await self.http.request(
            method, url, json=body, headers=self.headers(ref), timeout=ref.request_timeout_s
        )
        if r.status_code in (401, 403):
            raise errors.unauthorized(f"{url}: HTTP {r.status_code} (control token refused)")
        try:
            data: Any = r.json()
        except ValueError:
            data = None
        return r.status_code, data

    def _order(self, ref: RouterRef) -> list[str]:
        cached = self._holder.get(tuple(ref.routers))
        return ([cached] if cached else []) + [u for u in ref.routers if u != cached]

    async def find_holder(self, ref: RouterRef) -> FleetView:
        """The lifecycle view of the router that controls the fleet (cached holder tried first)."""
        seen: list[str] = []
        order = self._order(ref)
        for url in order:  # grows by the holder URL an active-active replica names
            try:
                status, body = await self._request(ref, "GET", f"{url}/narwhal/lifecycle")
            except httpx.HTTPError as exc:
                seen.append(f"{url}: {type(exc).__name__}")
                continue
            if status != 200 or not isinstance(body, dict):
                seen.append(f"{url}: HTTP {status}")
                continue
            try:
                view = view_of(lifecycle_document(body, url), url)
            except DocumentError as exc:
                seen.append(str(exc))
                continue
            if view.controls_fleet:
                self._holder[tuple(ref.routers)] = url
                return view
            seen.append(f"{url}: does not control the fleet")
            hint = holder_hint(body)
            if hint and hint not in order:
                order.append(hint)
        self._holder.pop(tuple(ref.routers), None)
        raise errors.router_unavailable("no router controls the fleet (" + "; ".join(seen) + ")")

    async def post(self, ref: RouterRef, path: str, body: dict[str, Any]) -> tuple[int, Any, str]:
        """POST to the holder; re-discover the holder when a router is down or not in control."""
        last = ""
        for _ in range(3):
            url = self._holder.get(tuple(ref.routers)) or (await self.find_holder(ref)).router_url
            try:
                status, data = await self._request(ref, "POST", f"{url}{path}", body)
            except httpx.HTTPError as exc:
                last = f"{url}: {type(exc).__name__}"
                self._holder.pop(tuple(ref.routers), None)
                continue
            if _not_controlling(status, data):
                last = f"{url}: {_error_of(data)}"
                self._holder.pop(tuple(ref.routers), None)
                continue
            return status, data, url
        raise errors.router_unavailable(f"{path}: no router accepted the request ({last})")

    async def get_ready(self, ref: RouterRef, url: str) -> tuple[int, Any]:
        return await self._request(ref, "GET", f"{url}/ready")

    async def roles_and_model(self, ref: RouterRef, url: str) -> tuple[dict[str, str], str, str]:
        """(roles, model, problem): ``problem`` non-empty when the handoff could not be read — the
        rolling plan then refuses to pick engines (role safety fails closed)."""
        try:
            status, body = await self._request(ref, "GET", f"{url}/narwhal/handoff")
        except httpx.HTTPError as exc:
            return {}, "", f"{url}/narwhal/handoff: {type(exc).__name__}"
        if status != 200:
            return {}, "", f"{url}/narwhal/handoff answered HTTP {status}"
        try:
            h = handoff_roles(body, f"{url}/narwhal/handoff")
        except DocumentError as exc:
            return {}, "", str(exc)
        return dict(h.roles), h.model, ""


def _view(doc: Any, url: str) -> FleetView | None:
    if isinstance(doc, dict) and doc.get("schema") == "narwhal.lifecycle":
        return parse_lifecycle(doc, url)
    return None


def _subset(view: FleetView, engines: list[str]) -> dict[str, EngineView]:
    return {i: view.engines[i] for i in engines if i in view.engines}


class LifecycleActivities:
    """Activities over the router's lifecycle API (registered once per worker)."""

    def __init__(self, client: LifecycleClient) -> None:
        self.client = client

    @activity.defn(name="read_fleet")
    async def read_fleet(self, ref: RouterRef) -> FleetView:
        view = await self.client.find_holder(ref)
        roles, model, problem = await self.client.roles_and_model(ref, view.router_url)
        return view.model_copy(update={"roles": roles, "model": model, "roles_error": problem})

    @activity.defn(name="drain")
    async def drain(self, req: DrainRequest) -> DrainOutcome:
        body = {"engines": req.engines, "wave": req.wave, "deadline_s": req.deadline_s}
        status, doc, url = await heartbeating(self.client.post(req.router, "/narwhal/lifecycle/drain", body))
        view = _view(doc, url)
        if status == 200 and view is not None:
            activity.logger.info("drain of %s acknowledged by %s", req.engines or "the wave", url)
            return DrainOutcome(engines=_subset(view, req.engines), wave_id=view.wave_id)
        error = _error_of(doc) or f"HTTP {status}"
        if status == 409 and ALREADY_ACTIVE in error:
            view = view or await self.client.find_holder(req.router)
            mine = _subset(view, req.engines)
            held = len(mine) == len(req.engines) and all(
                e.state in HELD_STATES and e.old_process_start is not None for e in mine.values()
            )
            if held and (
                not req.wave or (view.wave_active and all(e.wave_id == view.wave_id for e in mine.values()))
            ):
                activity.logger.info("drain of %s already active with identities recorded", req.engines)
                return DrainOutcome(engines=mine, wave_id=view.wave_id, already_active=True)
            if mine and all(e.state in HELD_STATES and e.old_process_start is None for e in mine.values()):
                raise errors.not_ready_yet(f"drain of {req.engines} in progress (identity not recorded yet)")
        if status in (409, 422):
            raise errors.unsafe_request(f"drain {','.join(req.engines) or 'wave'} refused: {error}")
        if status == 503 and view is not None:
            # identity capture failed: the targets stay held; repeating the same drain is the retry
            mine = _subset(view, req.engines)
            failures = {i: e.error or error for i, e in mine.items() if e.old_process_start is None}
            return DrainOutcome(engines=mine, wave_id=view.wave_id, capture_failures=failures or {"*": error})
        raise errors.router_unavailable(f"drain answered HTTP {status}: {error}")

    @activity.defn(name="wait_ready_to_stop")
    async def wait_ready_to_stop(self, req: StopWaitRequest) -> StopWait:
        polls = 0
        details = activity.info().heartbeat_details
        if details and isinstance(details[0], dict):
            polls = int(details[0].get("polls", 0))
        while True:
            polls += 1
            try:
                view = await self.client.find_holder(req.router)
            except ApplicationError as exc:
                if exc.type != errors.ROUTER_UNAVAILABLE:
                    raise
                activity.heartbeat({"polls": polls, "note": str(exc)})
                await asyncio.sleep(req.poll_interval_s)
                continue
            mine = _subset(view, req.engines)
            if len(mine) != len(req.engines):
                missing = sorted(set(req.engines) - set(mine))
                return StopWait(status="unexpected", engines=mine, message=f"unknown engine(s) {missing}")
            if all(e.ready_to_stop for e in mine.values()) and (not req.wave or view.wave_ready_to_stop):
                activity.logger.info("%s ready to stop after %d polls", req.engines, polls)
                return StopWait(status="ready_to_stop", engines=mine)
            odd = {i: e.state for i, e in mine.items() if e.state not in HELD_STATES}
            if odd:
                return StopWait(status="unexpected", engines=mine, message=f"engine(s) no longer held: {odd}")
            late = {i: e.error for i, e in mine.items() if e.state == "deadline_exceeded"}
            if late and req.stop_on_deadline:
                return StopWait(status="deadline_exceeded", engines=mine, message="; ".join(late.values()))
            activity.heartbeat(
                {"polls": polls, "states": {i: e.state for i, e in mine.items()},
                 "resident": {i: e.resident for i, e in mine.items()}}
            )  # fmt: skip
            await asyncio.sleep(req.poll_interval_s)

    @activity.defn(name="readmit")
    async def readmit(self, req: ReadmitRequest) -> ReadmitOutcome:
        body = {"engines": req.engines, "wave": req.wave}
        status, doc, url = await heartbeating(
            self.client.post(req.router, "/narwhal/lifecycle/readmit", body)
        )
        view = _view(doc, url)
        if status == 200 and view is not None:
            activity.logger.info("readmit of %s acknowledged by %s", req.engines, url)
            return ReadmitOutcome(engines=_subset(view, req.engines))
        error = _error_of(doc) or f"HTTP {status}"
        if status == 409:
            view = view or await self.client.find_holder(req.router)
            mine = _subset(view, req.engines)
            if len(mine) == len(req.engines) and all(self._readmitted(i, e, req) for i, e in mine.items()):
                activity.logger.info("readmit of %s already done", req.engines)
                return ReadmitOutcome(engines=mine, already_active=True)
            if any(e.state == "validating" for e in mine.values()):
                raise errors.not_ready_yet(f"readmission of {req.engines} is still validating")
            per_engine = {
                i: {"state": e.state, "error": e.error, "checks": e.checks} for i, e in mine.items()
            }
            reasons = "; ".join(f"{i}: {e.error}" for i, e in mine.items() if e.error)
            raise errors.validation_failed(
                f"readmit refused: {error}" + (f" ({reasons})" if reasons else ""), per_engine
            )
        raise errors.router_unavailable(f"readmit answered HTTP {status}: {error}")

    @staticmethod
    def _readmitted(iid: str, e: EngineView, req: ReadmitRequest) -> bool:
        old = req.old_process_starts.get(iid)
        newer = e.new_process_start is not None and (old is None or e.new_process_start > old)
        return e.state == "active" and newer

    @activity.defn(name="confirm_active")
    async def confirm_active(self, req: ConfirmRequest) -> FleetView:
        """Poll-by-retry: every engine ``active`` + ``accepts_new`` (and ``/ready`` 200 if asked)."""
        return await heartbeating(self._confirm_active(req))

    async def _confirm_active(self, req: ConfirmRequest) -> FleetView:
        view = await self.client.find_holder(req.router)
        mine = _subset(view, req.engines)
        bad = {
            i: f"{e.state}, accepts_new={e.accepts_new}"
            for i, e in mine.items()
            if not (e.state == "active" and e.accepts_new)
        }
        if bad or len(mine) != len(req.engines):
            raise errors.not_ready_yet(f"not serving yet: {bad}")
        if req.require_ready:
            status, body = await self.client.get_ready(req.router, view.router_url)
            if status != 200:
                reason = body.get("reason", "") if isinstance(body, dict) else ""
                raise errors.not_ready_yet(f"/ready is {status} {reason}".strip())
        return view.model_copy(update={"engines": mine})
