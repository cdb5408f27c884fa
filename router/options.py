"""``RouterOptions``: the ``narwhal-serve`` flags as one typed, frozen value.

Every field has a default (tests build routers in-process) and ``None`` means "the fleet file's
value". ``router/cli.py`` fills it from argparse (``dest`` = field name); ``router/settings.py``
merges it over the fleet file once, into the ``Settings`` every component is built from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RouterOptions:
    """Process options (CLI flags). ``None`` = the fleet file's value."""

    host: str = "127.0.0.1"
    port: int = 8000
    journal: str | None = None
    max_concurrent: int | None = None  # in-flight seats (default serving.max_connections)
    graceful_timeout: float | None = None  # default serving.graceful_timeout_s
    log_level: str = "info"
    probe_interval: float | None = None  # recovery probe cadence (default monitor_interval × readmit_every)
    # HA (router/ha/settings.py; None = fleet file ``ha`` / ``recovery`` value)
    resume: bool | None = None
    lease_path: str | None = None
    etcd_endpoints: str | None = None
    etcd_prefix: str | None = None
    etcd_cacert: str | None = None
    etcd_cert: str | None = None
    etcd_key: str | None = None
    etcd_user: str | None = None
    etcd_password_env: str | None = None
    router_id: str | None = None
    lease_ttl: float | None = None
    lease_renew_interval: float | None = None
    lease_safety_margin: float | None = None
    standby_of: str | None = None
    standby_probe_interval: float | None = None
    standby_takeover_after: int | None = None
    standby_max_handoff_age: float | None = None
    # active-active (router/replicas/settings.py; None = fleet file ``ha`` value)
    ha_mode: str | None = None
    replica_ttl: float | None = None
    replica_safety_margin: float | None = None
    advertise_url: str | None = None
    # control listener (router/listeners.py; None = fleet file ``control.host`` / ``control.port``)
    control_host: str | None = None
    control_port: int | None = None

    def validate(self) -> None:
        """Raise ValueError (CLI: exit 2) for flag values that cannot work, before the fleet file is read
        (the HA flags: ``ha.settings.check_options``, which ``cli.main`` and ``from_options`` run)."""
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise ValueError("--max-concurrent must be >= 1")
        for flag, v in (
            ("--graceful-timeout", self.graceful_timeout),
            ("--probe-interval", self.probe_interval),
        ):
            if v is not None and (not math.isfinite(v) or v < 0):
                raise ValueError(f"{flag} must be finite and >= 0")
