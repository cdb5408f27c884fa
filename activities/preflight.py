"""The first activity of every restart run: the worker's own checks, before anything is drained —
and who holds a fleet lock, when a run finds it taken.

``preflight``: every configured router's control API answers the worker, with the worker's own
token (``RouterRef.token_env`` read from the worker's environment); one of them holds the fleet;
every engine to restart answers at its address (``/metrics`` with ``process_start_time_seconds``:
what the restart later watches). Any failure is one non-retryable ``PreflightFailed`` line naming
what and why. It also returns the fleet's canonical identity (``narwhal_models.restart.fleet_identity``
over the engine addresses the router lists in ``GET /narwhal/targets``) for the fleet lock.

``fleet_lock_owner``: reads, with the worker's Temporal client, which run holds a lock (the lock's
parent) and that run's state, for the refusal line.
"""

from __future__ import annotations

from datetime import timedelta

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from activities import errors
from activities.documents import DocumentError, lifecycle_document, target_urls
from activities.engine_process import read_process_start
from activities.router import LifecycleClient, check_supervisor, view_of
from narwhal_models.restart import (
    FleetView,
    LockOwner,
    LockOwnerRequest,
    PreflightOutcome,
    PreflightRequest,
    RestartProgress,
    SupervisorRef,
    fleet_identity,
    fleet_lock_id,
)

RPC_TIMEOUT = timedelta(seconds=5)


class PreflightActivities:
    def __init__(self, client: LifecycleClient) -> None:
        self.client = client

    async def _get(self, req: PreflightRequest, url: str) -> tuple[int, object]:
        try:
            return await self.client.get(req.router, url)
        except ApplicationError as exc:  # token variable unset on the worker, or 401/403
            raise errors.preflight_failed(f"preflight: {exc.message}") from None
        except httpx.HTTPError as exc:
            raise errors.preflight_failed(
                f"preflight: {url} does not answer from the worker ({type(exc).__name__})"
            ) from None

    @activity.defn(name="preflight")
    async def preflight(self, req: PreflightRequest) -> PreflightOutcome:
        checked: list[str] = []
        holder: FleetView | None = None
        if req.rollback_template:  # the worker must have it before anything is drained
            check_supervisor(
                self.client.settings, SupervisorRef(backend="command", template=req.rollback_template)
            )
            checked.append(f"rollback template {req.rollback_template}: configured on this worker")
        routers = self.client.urls(req.router)
        for url in routers:
            status, body = await self._get(req, f"{url}/narwhal/lifecycle")
            if status != 200:
                raise errors.preflight_failed(f"preflight: {url}/narwhal/lifecycle answered HTTP {status}")
            try:
                view = view_of(lifecycle_document(body, f"{url}/narwhal/lifecycle"), url)
            except DocumentError as exc:
                raise errors.preflight_failed(f"preflight: {exc}") from None
            checked.append(f"{url}: control API answers the worker (controls_fleet={view.controls_fleet})")
            if view.controls_fleet and holder is None:
                holder = view
        if holder is None:
            raise errors.preflight_failed(
                f"preflight: none of {', '.join(routers)} controls the fleet (no lease holder)"
            )
        roles, model, problem = await self.client.roles_and_model(req.router, holder.router_url)
        pins, floors = await self.client.pins_and_floors(req.router, holder.router_url)
        view = holder.model_copy(
            update={"roles": roles, "model": model, "roles_error": problem, "pins": pins, "floors": floors}
        )
        where = f"{holder.router_url}/narwhal/targets"
        status, body = await self._get(req, where)
        listed: dict[str, str] = {}
        if status == 200:
            try:
                listed = target_urls(body, where)
            except DocumentError as exc:
                raise errors.preflight_failed(f"preflight: {exc}") from None
        # the identity covers every engine of the router, whatever subset this run restarts
        addresses = {i: listed.get(i) or req.engine_urls.get(i, "") for i in view.engines}
        unknown = [i for i in req.engines if i not in view.engines]
        if unknown:
            raise errors.preflight_failed(
                f"preflight: the router does not know engine(s) {', '.join(unknown)}"
            )
        if missing := sorted(i for i, u in addresses.items() if not u):
            raise errors.preflight_failed(
                f"preflight: no address for engine(s) {', '.join(missing)} ({where} answered HTTP {status})"
            )
        for iid in req.engines or sorted(view.engines):
            url = (req.engine_urls.get(iid) or addresses[iid]).rstrip("/")
            why = await self._engine_answers(url)
            if why:
                raise errors.preflight_failed(f"preflight: engine {iid} at {url} {why}")
            checked.append(f"{iid}: answers at {url}")
        identity = fleet_identity(addresses)
        return PreflightOutcome(
            view=view, identity=identity, lock_id=fleet_lock_id(identity), engine_urls=addresses,
            checked=checked,
        )  # fmt: skip

    async def _engine_answers(self, url: str) -> str:
        """ "" when the engine reports its process start at ``url``; else why not."""
        return (await read_process_start(self.client.http, url)).problem


@activity.defn(name="fleet_lock_owner")
async def fleet_lock_owner(req: LockOwnerRequest) -> LockOwner:
    """Who holds ``req.lock_id`` (its parent run), that run's state, and how to steer it."""
    client = activity.client()
    try:
        desc = await client.get_workflow_handle(req.lock_id).describe(rpc_timeout=RPC_TIMEOUT)
    except RPCError as exc:
        return LockOwner(lock_id=req.lock_id, message=f"fleet lock {req.lock_id} is held ({exc.message})")
    owner, run_id = desc.parent_id or "", desc.parent_run_id or ""
    state = ""
    if owner:
        try:
            p = await client.get_workflow_handle(owner, run_id=run_id or None).query(
                "progress", result_type=RestartProgress, rpc_timeout=RPC_TIMEOUT
            )
            state = p.state + (f" — {p.message}" if p.message else "")
        except RPCError as exc:
            state = f"state unknown: {exc.message}"
    who = owner or "another run"
    steer = (
        f"; steer it with `narwhal-restart status|pause|resume|approve|abort --workflow-id {owner}`"
        if owner
        else ""
    )
    return LockOwner(
        lock_id=req.lock_id, owner=owner, owner_run_id=run_id, state=state,
        message=f"refused: fleet {req.fleet} is already being restarted by {who} ({state or 'running'})"
        f"{steer}; nothing was drained",
    )  # fmt: skip
