"""HA runtime settings: the fleet file's ``ha`` / ``recovery`` keys overridden by narwhal-serve flags.

``add_arguments`` + ``from_options`` are the CLI seam (``router/cli.py``, ``router/assemble.py``); ``HARuntime``
validates itself, so ``create_app``-style callers that build it directly are checked the same way.
Non-finite values are refused before anything touches a file.
"""

from __future__ import annotations

import argparse
import math
import socket
from dataclasses import dataclass

from router.config import FleetConfig, check_lease_timing
from router.ha.etcd_client import parse_endpoints
from router.ha.etcd_lease import EtcdLeaseSettings, check_prefix, default_prefix
from router.ha.lease import LeaseSettings

# float flag -> HASettings / HARuntime field; all also settable in the fleet file's ``ha`` section
FLOAT_FLAGS: dict[str, str] = {
    "lease-ttl": "lease_ttl_s",
    "lease-renew-interval": "lease_renew_interval_s",
    "lease-safety-margin": "lease_safety_margin_s",
    "standby-probe-interval": "standby_probe_interval_s",
    "standby-max-handoff-age": "standby_max_handoff_age_s",
}


@dataclass(frozen=True)
class HARuntime:
    state_path: str
    resume: bool = False
    lease_path: str = ""
    etcd_endpoints: str = ""  # comma-separated http(s)://host:port; selects the etcd backend
    etcd_prefix: str = ""  # default /narwhal/<model>/
    model: str = ""
    router_id: str = ""
    lease_ttl_s: float = 5.0
    lease_renew_interval_s: float = 1.0
    lease_safety_margin_s: float = 1.0
    standby_of: str = ""
    standby_probe_interval_s: float = 0.25
    standby_takeover_after: int = 4
    standby_max_handoff_age_s: float = 30.0
    persist_interval_s: float = 1.0

    def __post_init__(self) -> None:
        check_lease_timing(self.lease_ttl_s, self.lease_renew_interval_s, self.lease_safety_margin_s)
        for name in ("standby_probe_interval_s", "standby_max_handoff_age_s", "persist_interval_s"):
            v = getattr(self, name)
            if not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name.removesuffix('_s')} must be finite and positive")
        if isinstance(self.standby_takeover_after, bool) or self.standby_takeover_after < 1:
            raise ValueError("standby_takeover_after must be >= 1")
        if self.lease_path and self.etcd_endpoints:
            raise ValueError(
                "--lease-path and --etcd-endpoints are mutually exclusive: choose one lease backend"
            )
        if self.etcd_endpoints:
            try:
                parse_endpoints(self.etcd_endpoints)
            except ValueError as exc:
                raise ValueError(f"--etcd-endpoints: {exc}") from None
        if self.etcd_prefix:
            if not self.etcd_endpoints:
                raise ValueError("--etcd-prefix requires --etcd-endpoints")
            try:
                check_prefix(self.etcd_prefix)
            except ValueError as exc:
                raise ValueError(f"--etcd-prefix: {exc}") from None
        if self.standby_of and not self.has_lease:
            raise ValueError("--standby-of requires --lease-path or --etcd-endpoints")
        if self.has_lease and not self.router_id:
            raise ValueError("router id must not be empty when a lease is configured")

    @property
    def has_lease(self) -> bool:
        return bool(self.lease_path or self.etcd_endpoints)

    @property
    def lease_location(self) -> str:
        """For logs and ``/narwhal/state``: the lease file, or the etcd prefix and endpoints."""
        if self.etcd_endpoints:
            return f"etcd {self.etcd_endpoints} {self.resolved_prefix}"
        return self.lease_path

    @property
    def resolved_prefix(self) -> str:
        return self.etcd_prefix or default_prefix(self.model)

    def etcd_settings(self) -> EtcdLeaseSettings | None:
        if not self.etcd_endpoints:
            return None
        return EtcdLeaseSettings(
            router_id=self.router_id,
            prefix=self.resolved_prefix,
            model=self.model,
            ttl_s=self.lease_ttl_s,
            renew_interval_s=self.lease_renew_interval_s,
            safety_margin_s=self.lease_safety_margin_s,
        )

    def lease_settings(self) -> LeaseSettings | None:
        if not self.lease_path:
            return None
        return LeaseSettings(
            path=self.lease_path,
            router_id=self.router_id,
            ttl_s=self.lease_ttl_s,
            renew_interval_s=self.lease_renew_interval_s,
            safety_margin_s=self.lease_safety_margin_s,
        )


def from_config(config: FleetConfig, port: int = 8000, **overrides: object) -> HARuntime:
    ha = config.ha
    values: dict[str, object] = {
        "state_path": config.recovery.state_path,
        "resume": config.recovery.resume,
        "lease_path": ha.lease_path,
        "etcd_endpoints": ha.etcd_endpoints,
        "etcd_prefix": ha.etcd_prefix,
        "model": config.model,
        "router_id": ha.router_id or f"{socket.gethostname()}:{port}",
        "lease_ttl_s": ha.lease_ttl_s,
        "lease_renew_interval_s": ha.lease_renew_interval_s,
        "lease_safety_margin_s": ha.lease_safety_margin_s,
        "standby_probe_interval_s": ha.standby_probe_interval_s,
        "standby_takeover_after": ha.standby_takeover_after,
        "standby_max_handoff_age_s": ha.standby_max_handoff_age_s,
        "persist_interval_s": config.controller.monitor_interval_s,
    }
    values.update({k: v for k, v in overrides.items() if v is not None})
    return HARuntime(**values)  # type: ignore[arg-type]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("HA (lease fencing, handoff, warm standby)")
    g.add_argument("--resume", action="store_true", default=None, help="apply recovery.state_path at startup")
    g.add_argument("--lease-path", default=None, help="shared lease file (enables fencing)")
    g.add_argument(
        "--etcd-endpoints",
        default=None,
        metavar="URL[,URL...]",
        help="etcd client URLs: the lease, epoch and fenced handoff live in etcd (not with --lease-path)",
    )
    g.add_argument(
        "--etcd-prefix", default=None, metavar="PREFIX", help="etcd key prefix (default /narwhal/<model>/)"
    )
    g.add_argument("--router-id", default=None, help="lease holder prefix (default <hostname>:<port>)")
    g.add_argument("--lease-ttl", type=float, default=None, help="lease TTL seconds (default 5)")
    g.add_argument("--lease-renew-interval", type=float, default=None, help="renewal period (default 1)")
    g.add_argument(
        "--lease-safety-margin", type=float, default=None, help="local validity margin (default 1)"
    )
    g.add_argument("--standby-of", default=None, metavar="URL", help="shadow this primary router")
    g.add_argument("--standby-probe-interval", type=float, default=None, help="probe period (default 0.25)")
    g.add_argument("--standby-takeover-after", type=int, default=None, help="missed probes before takeover")
    g.add_argument(
        "--standby-max-handoff-age", type=float, default=None, help="max snapshot age (default 30)"
    )


# RouterOptions field (= argparse dest) for each flag; the same names on any options object
OPTION_FIELDS: tuple[str, ...] = (
    "resume",
    "lease_path",
    "etcd_endpoints",
    "etcd_prefix",
    "router_id",
    "lease_ttl",
    "lease_renew_interval",
    "lease_safety_margin",
    "standby_of",
    "standby_probe_interval",
    "standby_takeover_after",
    "standby_max_handoff_age",
)


def check_options(options: object) -> None:
    """Flag errors that need no fleet file (CLI exit 2): non-finite numbers, bad counts."""
    for flag in FLOAT_FLAGS:
        v = getattr(options, flag.replace("-", "_"), None)
        if v is not None and not math.isfinite(v):
            raise ValueError(f"--{flag} must be finite")
    if getattr(options, "lease_path", None) and getattr(options, "etcd_endpoints", None):
        raise ValueError("--lease-path and --etcd-endpoints are mutually exclusive: choose one lease backend")
    endpoints = getattr(options, "etcd_endpoints", None)
    if endpoints is not None:
        try:
            parse_endpoints(endpoints)
        except ValueError as exc:
            raise ValueError(f"--etcd-endpoints: {exc}") from None
    n = getattr(options, "standby_takeover_after", None)
    if n is not None and n < 1:
        raise ValueError("--standby-takeover-after must be >= 1")


def from_options(config: FleetConfig, options: object, port: int = 8000) -> HARuntime:
    """Merge flags (argparse namespace or ``RouterOptions``) over the fleet file; ``ValueError``."""
    check_options(options)
    overrides: dict[str, object] = {
        "resume": True if getattr(options, "resume", None) else None,
        "lease_path": getattr(options, "lease_path", None),
        "etcd_endpoints": getattr(options, "etcd_endpoints", None),
        "etcd_prefix": getattr(options, "etcd_prefix", None),
        "router_id": getattr(options, "router_id", None),
        "standby_of": getattr(options, "standby_of", None),
        "standby_takeover_after": getattr(options, "standby_takeover_after", None),
    }
    for flag, field_name in FLOAT_FLAGS.items():
        overrides[field_name] = getattr(options, flag.replace("-", "_"), None)
    return from_config(config, port=port, **overrides)
