"""HA runtime settings: the fleet file's ``ha`` / ``recovery`` keys overridden by narwhal-serve flags.

``add_arguments`` (the flags) and ``from_options`` (the typed ``RouterOptions`` over the fleet file,
called once by ``router/settings.py``) are the CLI seam; ``HARuntime`` validates itself, so callers
that build it directly are checked the same way.
Non-finite values are refused before anything touches a file.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from router.config import FleetConfig, check_lease_timing
from router.ha.etcd_client import EtcdSecurity, parse_endpoints
from router.ha.etcd_lease import EtcdLeaseSettings, check_prefix, default_prefix
from router.ha.lease import LeaseSettings

if TYPE_CHECKING:
    from router.options import RouterOptions

T = TypeVar("T")


@dataclass(frozen=True)
class HARuntime:
    state_path: str
    resume: bool = False
    lease_path: str = ""
    etcd_endpoints: str = ""  # comma-separated http(s)://host:port; selects the etcd backend
    etcd_prefix: str = ""  # default /narwhal/<model>/
    etcd_cacert: str = ""  # TLS: CA bundle (https:// endpoints)
    etcd_cert: str = ""  # TLS client certificate (etcd --client-cert-auth), with etcd_key
    etcd_key: str = ""
    etcd_user: str = ""  # etcd authentication, password from the variable etcd_password_env
    etcd_password_env: str = ""
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
        secured = [
            f
            for f in ("etcd_cacert", "etcd_cert", "etcd_key", "etcd_user", "etcd_password_env")
            if getattr(self, f)
        ]
        if secured and not self.etcd_endpoints:
            raise ValueError(f"--{secured[0].replace('_', '-')} requires --etcd-endpoints")
        if self.etcd_password_env and not self.etcd_user:
            raise ValueError("--etcd-password-env requires --etcd-user")
        if self.etcd_user and not self.etcd_password_env:
            raise ValueError("--etcd-user requires --etcd-password-env (the variable holding the password)")
        if self.etcd_password_env and not os.environ.get(self.etcd_password_env):
            raise ValueError(f"--etcd-password-env: environment variable {self.etcd_password_env} is not set")
        if self.etcd_endpoints:
            problems = self.etcd_security().problems(parse_endpoints(self.etcd_endpoints))
            if problems:
                raise ValueError("; ".join(problems))
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

    def etcd_security(self) -> EtcdSecurity:
        """TLS files and credentials for the etcd client (the password read from its variable)."""
        password = os.environ.get(self.etcd_password_env, "") if self.etcd_password_env else ""
        return EtcdSecurity(self.etcd_cacert, self.etcd_cert, self.etcd_key, self.etcd_user, password)

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


def _pick(flag: T | None, file: T) -> T:
    """A flag's value when it was given, else the fleet file's."""
    return file if flag is None else flag


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
    g.add_argument(
        "--etcd-cacert", default=None, metavar="FILE", help="CA bundle for https:// etcd endpoints"
    )
    g.add_argument("--etcd-cert", default=None, metavar="FILE", help="TLS client certificate for etcd")
    g.add_argument("--etcd-key", default=None, metavar="FILE", help="key of --etcd-cert")
    g.add_argument("--etcd-user", default=None, help="etcd user (authentication; with --etcd-password-env)")
    g.add_argument(
        "--etcd-password-env",
        default=None,
        metavar="VAR",
        help="environment variable holding the etcd password",
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


def check_options(options: RouterOptions) -> None:
    """Flag errors that need no fleet file (CLI exit 2): non-finite numbers, bad counts."""
    floats = {
        "lease-ttl": options.lease_ttl,
        "lease-renew-interval": options.lease_renew_interval,
        "lease-safety-margin": options.lease_safety_margin,
        "standby-probe-interval": options.standby_probe_interval,
        "standby-max-handoff-age": options.standby_max_handoff_age,
    }
    for flag, v in floats.items():
        if v is not None and not math.isfinite(v):
            raise ValueError(f"--{flag} must be finite")
    if options.lease_path and options.etcd_endpoints:
        raise ValueError("--lease-path and --etcd-endpoints are mutually exclusive: choose one lease backend")
    if options.etcd_endpoints is not None:
        try:
            parse_endpoints(options.etcd_endpoints)
        except ValueError as exc:
            raise ValueError(f"--etcd-endpoints: {exc}") from None
    n = options.standby_takeover_after
    if n is not None and n < 1:
        raise ValueError("--standby-takeover-after must be >= 1")


def from_options(config: FleetConfig, options: RouterOptions, port: int = 8000) -> HARuntime:
    """The flags over the fleet file's ``ha`` / ``recovery`` keys (``router/settings.py`` calls it
    once); ``ValueError`` when the result cannot work."""
    check_options(options)
    ha = config.ha
    return HARuntime(
        state_path=config.recovery.state_path,
        resume=True if options.resume else config.recovery.resume,
        lease_path=_pick(options.lease_path, ha.lease_path),
        etcd_endpoints=_pick(options.etcd_endpoints, ha.etcd_endpoints),
        etcd_prefix=_pick(options.etcd_prefix, ha.etcd_prefix),
        etcd_cacert=_pick(options.etcd_cacert, ha.etcd_cacert),
        etcd_cert=_pick(options.etcd_cert, ha.etcd_cert),
        etcd_key=_pick(options.etcd_key, ha.etcd_key),
        etcd_user=_pick(options.etcd_user, ha.etcd_user),
        etcd_password_env=_pick(options.etcd_password_env, ha.etcd_password_env),
        model=config.model,
        router_id=_pick(options.router_id, ha.router_id or f"{socket.gethostname()}:{port}"),
        lease_ttl_s=_pick(options.lease_ttl, ha.lease_ttl_s),
        lease_renew_interval_s=_pick(options.lease_renew_interval, ha.lease_renew_interval_s),
        lease_safety_margin_s=_pick(options.lease_safety_margin, ha.lease_safety_margin_s),
        standby_of=_pick(options.standby_of, ""),  # a flag only
        standby_probe_interval_s=_pick(options.standby_probe_interval, ha.standby_probe_interval_s),
        standby_takeover_after=_pick(options.standby_takeover_after, ha.standby_takeover_after),
        standby_max_handoff_age_s=_pick(options.standby_max_handoff_age, ha.standby_max_handoff_age_s),
        persist_interval_s=config.controller.monitor_interval_s,
    )
