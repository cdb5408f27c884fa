"""How active-active plugs into a router process (used by ``router/assemble.py``).

``replica_components`` returns ``[]`` in active-passive mode. In active-active mode it builds the
``ReplicaService`` (its own etcd client: the watches hold streams open) and adapts three
collaborators so that a replica that does not hold the lease still serves:

- the prober keeps probing ejected engines (breaker evidence is local to each replica); on a
  follower, a contracted fleet's engine comes back when it answers ``/health`` with the process
  start the holder accepted (``recover_local``), never by a local lifecycle mutation;
- the lifecycle monitor's whole-wave reaction to an ejection runs only on the holder;
- ``/narwhal/state`` gains ``replicas``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from router.app import Component
from router.config import FleetConfig
from router.core import RouterCore
from router.ha.etcd_client import EtcdClient
from router.lifecycle.service import LifecycleService
from router.replicas.service import ReplicaService, ReplicaSettings

if TYPE_CHECKING:
    from router.ha.settings import HARuntime
    from router.options import RouterOptions

log = logging.getLogger("narwhal.replicas")


def local_recovery(service: ReplicaService) -> Callable[[str], Awaitable[bool]]:
    """A follower's recovery of an engine its own breaker ejected (contracted fleets)."""
    core, lifecycle = service.core, service.lifecycle

    async def recover_local(iid: str) -> bool:
        accepted = lifecycle.machine.process_starts.get(iid)
        if accepted is None or iid in core.scheduler.draining or core.scheduler.fleet_hold:
            return False  # held by the holder's lifecycle: only the holder readmits it
        if not await lifecycle.control.health(iid):
            return False
        try:
            identity = await lifecycle.control.identity(iid)
        except Exception as exc:
            log.info("engine %s identity unreadable during local recovery: %s", iid, type(exc).__name__)
            return False
        return identity.process_start == accepted

    return recover_local


def adapt_prober(service: ReplicaService, prober: Any) -> None:
    if prober is None:
        return
    holder_validator: Callable[[str], Awaitable[bool]] | None = prober.recovery_validator
    follower_validator = local_recovery(service)

    async def validate(iid: str) -> bool:
        if service.core.controls_fleet() and holder_validator is not None:
            return await holder_validator(iid)
        return await follower_validator(iid)

    if holder_validator is not None:  # contracted fleet: lifecycle validation (holder) / identity (follower)
        prober.recovery_validator = validate


def replica_components(
    core: RouterCore,
    lifecycle: LifecycleService | None,
    settings: ReplicaSettings | None,
    endpoints: str,
    prober: Any = None,
    ha: Any = None,
) -> list[Component]:
    if settings is None:
        return []
    if lifecycle is None:
        raise ValueError("active-active mode needs the lifecycle component")
    security = ha.settings.etcd_security() if ha is not None else None  # the HA backend's TLS/auth
    client = EtcdClient(endpoints, timeout_s=1.0, retry_s=0.0, security=security)
    service = ReplicaService(core, lifecycle, client, settings)
    service.on_start.append(lambda: adapt_prober(service, prober))  # after the monitor set its validator
    if ha is not None:
        ha.adopt = service.adopt  # a takeover adopts the lifecycle only
    return [service]


def default_prefix(model: str) -> str:
    """``/narwhal/<model>/`` with the model name made key-safe (the HA backend's default)."""
    safe = "".join(c if c.isalnum() or c in "-_.:" else "_" for c in model) or "model"
    return f"/narwhal/{safe}/"


def settings_for(
    config: FleetConfig, options: RouterOptions, runtime: HARuntime
) -> tuple[ReplicaSettings | None, str]:
    """(replica settings or None in active-passive mode, etcd endpoints); ``ValueError`` = usage error."""
    from router.replicas import settings as replica_settings

    endpoints = runtime.etcd_endpoints
    prefix = runtime.etcd_prefix or default_prefix(config.model)
    return replica_settings.from_options(config, options, runtime.router_id, prefix, endpoints), endpoints
