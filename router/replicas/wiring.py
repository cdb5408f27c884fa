"""How active-active plugs into a router process (used by ``router/assemble.py``).

In active-passive mode there is nothing to build (``settings_for`` returns no settings; the mode
is ``router.control_mode.ActivePassive``). In active-active mode ``assemble`` builds, in order:

1. ``replica_set`` — this replica's picture of the set, before the lifecycle: the lifecycle reads
   it for resident work and ``ready_to_stop`` (``LifecycleService(replicas=...)``);
2. ``active_active`` — the ``ReplicaService`` (its own etcd client: the watches hold streams open)
   and the ``ActiveActive`` mode over it (``router/replicas/mode.py``): readiness, placement,
   the drain's acknowledgement, a takeover's adoption and a follower's recovery.

The mode reaches the components as a typed value (``RouterCore.mode``, ``HAService(mode=...)``);
nothing here patches another component.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from router.config import FleetConfig
from router.core import RouterCore
from router.ha.etcd_client import EtcdClient, EtcdSecurity
from router.ha.etcd_keys import default_prefix
from router.lifecycle.service import LifecycleService
from router.replicas.mode import ActiveActive
from router.replicas.picture import ReplicaSet
from router.replicas.service import ReplicaService, ReplicaSettings
from router.replicas.service import replica_set as replica_set  # assembly builds it first

if TYPE_CHECKING:
    from router.ha.settings import HARuntime
    from router.options import RouterOptions


def active_active(
    core: RouterCore,
    lifecycle: LifecycleService,
    settings: ReplicaSettings,
    endpoints: str,
    replicas: ReplicaSet,
    security: EtcdSecurity | None = None,
) -> ActiveActive:
    """The replica component and the mode over it (``security``: the HA backend's TLS/auth)."""
    client = EtcdClient(endpoints, timeout_s=1.0, retry_s=0.0, security=security)
    return ActiveActive(ReplicaService(core, lifecycle, client, settings, replicas=replicas))


def settings_for(
    config: FleetConfig, options: RouterOptions, runtime: HARuntime
) -> tuple[ReplicaSettings | None, str]:
    """(replica settings or None in active-passive mode, etcd endpoints); ``ValueError`` = usage error."""
    from router.replicas import settings as replica_settings

    endpoints = runtime.etcd_endpoints
    prefix = runtime.etcd_prefix or default_prefix(config.model)
    return replica_settings.from_options(config, options, runtime.router_id, prefix, endpoints), endpoints
