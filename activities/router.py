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
    state_floors,
)
from activities.heartbeat import heartbeating
from activities.worker_config import (
    Refused,
    Router,
    WorkerConfigError,
    WorkerSettings,
    resolve_router,
    resolve_template,
)
from narwhal_models.restart import (
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
    SupervisorRef,
)
from router.ids import UnsafeValue, check_engine_id

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
    """Talks to whichever configured router holds the lease.

    Every call goes to a URL of the worker's configuration (``WorkerSettings``): the workflow's
    ``RouterRef`` only names the router, and the bearer token of that router is sent to its
    configured URLs and nowhere else (a holder URL a replica names outside them is not followed)."""

    def __init__(
        self, http: httpx.AsyncClient, settings: WorkerSettings, env: Mapping[str, str] | None = None
    ) -> None:
        self.http = http
        self.settings = settings
        self.env = env if env is not None else os.environ
        self._holder: dict[str, str] = {}

    def resolve(self, ref: RouterRef) -> Router:
        """The configured router ``ref`` names; a non-retryable ``WorkerRefused`` otherwise."""
        try:
            return resolve_router(self.settings.current(), ref)
        except (Refused, WorkerConfigError) as exc:
            raise errors.worker_refused(str(exc)) from None

    def headers(self, router: Router) -> dict[str, str]:
        try:
            token = router.token(self.env)
        except WorkerConfigError as exc:
            raise errors.unauthorized(str(exc)) from None
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def _request(
        self, router: Router, method: str, url: str, body: Any = None, wait_s: float = 10.0
    ) -> tuple[int, Any]:
        if not any(url == u or url.startswith(u + "/") for u in router.urls):  # the token stays home
            raise errors.worker_refused(
                f"{url} is not a URL of router {router.name} ({', '.join(router.urls)})"
            )
        r = await self.http.request(method, url, json=body, headers=self.headers(router), timeout=wait_s)
        if r.status_code in (401, 403):
            raise errors.unauthorized(f"{url}: HTTP {r.status_code} (control token refused)")
        try:
            data: Any = r.json()
        except ValueError:
            data = None
        return r.status_code, data

    def _order(self, router: Router) -> list[str]:
        cached = self._holder.get(router.name)
        return ([cached] if cached in router.urls else []) + [u for u in router.urls if u != cached]

    async def find_holder(self, ref: RouterRef) -> FleetView:
        """The lifecycle view of the router that controls the fleet (cached holder tried first)."""
        router = self.resolve(ref)
        seen: list[str] = []
        for url in self._order(router):
            try:
                status, body = await self._request(
                    router, "GET", f"{url}/narwhal/lifecycle", wait_s=ref.request_timeout_s
                )
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
                self._holder[router.name] = url
                return view
            hint = holder_hint(body)
            outside = (
                f" (names holder {hint}, not a URL of router {router.name})"
                if hint and hint not in router.urls
                else ""
            )
            seen.append(f"{url}: does not control the fleet{outside}")
        self._holder.pop(router.name, None)
        raise errors.router_unavailable("no router controls the fleet (" + "; ".join(seen) + ")")

    async def post(self, ref: RouterRef, path: str, body: dict[str, Any]) -> tuple[int, Any, str]:
        """POST to the holder; re-discover the holder when a router is down or not in control."""
        router = self.resolve(ref)
        last = ""
        for _ in range(3):
            url = self._holder.get(router.name) or (await self.find_holder(ref)).router_url
            try:
                status, data = await self._request(
                    router, "POST", f"{url}{path}", body, ref.request_timeout_s
                )
            except httpx.HTTPError as exc:
                last = f"{url}: {type(exc).__name__}"
                self._holder.pop(router.name, None)
                continue
            if _not_controlling(status, data):
                last = f"{url}: {_error_of(data)}"
                self._holder.pop(router.name, None)
                continue
            return status, data, url
        raise errors.router_unavailable(f"{path}: no router accepted the request ({last})")

    async def get_ready(self, ref: RouterRef, url: str) -> tuple[int, Any]:
        return await self._request(self.resolve(ref), "GET", f"{url}/ready", wait_s=ref.request_timeout_s)

    async def roles_and_model(self, ref: RouterRef, url: str) -> tuple[dict[str, str], str, str]:
        """(roles, model, problem): ``problem`` non-empty when the handoff could not be read — the
        rolling plan then refuses to pick engines (role safety fails closed)."""
        try:
            status, body = await self._request(
                self.resolve(ref), "GET", f"{url}/narwhal/handoff", wait_s=ref.request_timeout_s
            )
        except httpx.HTTPError as exc:
            return {}, "", f"{url}/narwhal/handoff: {type(exc).__name__}"
        if status != 200:
            return {}, "", f"{url}/narwhal/handoff answered HTTP {status}"
        try:
            h = handoff_roles(body, f"{url}/narwhal/handoff")
        except DocumentError as exc:
            return {}, "", str(exc)
        return dict(h.roles), h.model, ""

    # The two seams the worker's preflight (activities/preflight.py) uses: URLs and token come from
    # the worker's configuration (resolve), never from workflow input.

    def urls(self, ref: RouterRef) -> list[str]:
        """Every URL of the router ``ref`` names."""
        return list(self.resolve(ref).urls)

    async def get(self, ref: RouterRef, url: str) -> tuple[int, Any]:
        """GET with the router's token (``Unauthorized`` when it is missing or refused)."""
        return await self._request(self.resolve(ref), "GET", url, wait_s=ref.request_timeout_s)

    async def pins_and_floors(self, ref: RouterRef, url: str) -> tuple[dict[str, bool], dict[str, int]]:
        """Pins and role floors from ``GET /narwhal/state`` (what the router's floor rule counts);
        empty when the router does not serve it (then the plan keeps the strict labelled-role rule)."""
        try:
            status, body = await self.get(ref, f"{url}/narwhal/state")
        except httpx.HTTPError:
            return {}, {}
        try:
            s = state_floors(body) if status == 200 else None
        except DocumentError:
            s = None
        if s is None:
            return {}, {}
        return {i: e.pin for i, e in s.scheduler.engines.items()}, {
            "prefill": s.scheduler.floors.prefill,
            "decode": s.scheduler.floors.decode,
        }


def _view(doc: Any, url: str) -> FleetView | None:
    if isinstance(doc, dict) and doc.get("schema") == "narwhal.lifecycle":
        return parse_lifecycle(doc, url)
    return None


def _subset(view: FleetView, engines: list[str]) -> dict[str, EngineView]:
    return {i: view.engines[i] for i in engines if i in view.engines}


def check_engines(engines: list[str]) -> None:
    """Workflow input's engine ids, held to ``router/ids.py`` (a non-retryable ``WorkerRefused``)."""
    try:
        for iid in engines:
            check_engine_id(iid, "workflow input: engine id")
    except UnsafeValue as exc:
        raise errors.worker_refused(str(exc)) from None


def check_supervisor(settings: WorkerSettings, sup: SupervisorRef | None) -> None:
    """A ``command`` backend must name a template this worker has (checked before the drain)."""
    if sup is None or sup.backend != "command":
        return
    try:
        resolve_template(settings.current(), sup)
    except (Refused, WorkerConfigError) as exc:
        raise errors.worker_refused(str(exc)) from None


class LifecycleActivities:
    """Activities over the router's lifecycle API (registered once per worker)."""

    def __init__(self, client: LifecycleClient) -> None:
        self.client = client

    @activity.defn(name="read_fleet")
    async def read_fleet(self, ref: RouterRef) -> FleetView:
        view = await self.client.find_holder(ref)
        roles, model, problem = await self.client.roles_and_model(ref, view.router_url)
        pins, floors = await self.client.pins_and_floors(ref, view.router_url)
        return view.model_copy(
            update={"roles": roles, "model": model, "roles_error": problem, "pins": pins, "floors": floors}
        )

    @activity.defn(name="drain")
    async def drain(self, req: DrainRequest) -> DrainOutcome:
        check_engines(req.engines)
        check_supervisor(self.client.settings, req.supervisor)
        self.client.resolve(req.router)  # an unknown router is refused before anything is drained
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
        check_engines(req.engines)
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
        check_engines(req.engines)
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
        check_engines(req.engines)
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
