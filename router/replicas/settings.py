"""Active-active settings: the fleet file's ``ha.mode`` / ``ha.replica_*`` / ``ha.advertise_url``
overridden by ``narwhal-serve`` flags (``--ha-mode``, ``--replica-ttl``, ``--replica-safety-margin``,
``--advertise-url``). ``from_options`` returns ``None`` in active-passive mode (the default) and
raises ``ValueError`` (CLI: exit 2) for active-active without the etcd backend.
"""

from __future__ import annotations

import argparse
import math
import socket
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from router.config import FleetConfig, check_replica_timing
from router.replicas.service import ReplicaSettings

if TYPE_CHECKING:
    from router.options import RouterOptions

MODES = ("active-passive", "active-active")
NEEDS_ETCD = "--ha-mode active-active requires the etcd backend (--etcd-endpoints or ha.etcd_endpoints)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("active-active (every replica serves; the lease holder controls)")
    g.add_argument("--ha-mode", choices=MODES, default=None, help="HA mode (default ha.mode: active-passive)")
    g.add_argument(
        "--replica-ttl", type=float, default=None, help="membership key TTL, whole seconds (default 2)"
    )
    g.add_argument(
        "--replica-safety-margin", type=float, default=None, help="stop placing this early (default 0.5)"
    )
    g.add_argument(
        "--advertise-url", default=None, metavar="URL", help="this replica's control URL for others"
    )


def check_options(options: RouterOptions) -> None:
    for flag, v in (
        ("--replica-ttl", options.replica_ttl),
        ("--replica-safety-margin", options.replica_safety_margin),
    ):
        if v is not None and not math.isfinite(v):
            raise ValueError(f"{flag} must be finite")
    url = options.advertise_url
    if url:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--advertise-url {url!r} must be an http(s)://host:port URL")


def mode_of(config: FleetConfig, options: RouterOptions) -> str:
    return options.ha_mode or config.ha.mode


def default_control_url(config: FleetConfig, options: RouterOptions) -> str:
    host = options.control_host or config.control.host or options.host
    port = options.control_port or config.control.port or options.port
    if host in ("", "0.0.0.0", "::"):  # a wildcard bind is not an address others can reach
        host = socket.gethostname() if host else "127.0.0.1"
    return f"http://{host}:{port}"


def from_options(
    config: FleetConfig, options: RouterOptions, replica_id: str, prefix: str, etcd_endpoints: str
) -> ReplicaSettings | None:
    """The replica settings, or None in active-passive mode."""
    check_options(options)
    if mode_of(config, options) != "active-active":
        return None
    if not etcd_endpoints:
        raise ValueError(NEEDS_ETCD)
    if options.standby_of:
        raise ValueError(
            "--standby-of is an active-passive setting: with --ha-mode active-active every replica serves"
        )
    ha = config.ha
    ttl = ha.replica_ttl_s if options.replica_ttl is None else options.replica_ttl
    margin = (
        ha.replica_safety_margin_s if options.replica_safety_margin is None else options.replica_safety_margin
    )
    check_replica_timing(ttl, margin, ha.replica_ack_timeout_s)
    url = options.advertise_url or ha.advertise_url or default_control_url(config, options)
    return ReplicaSettings(
        prefix=prefix,
        replica_id=replica_id,
        control_url=url.rstrip("/"),
        ttl_s=ttl,
        safety_margin_s=margin,
        ack_timeout_s=ha.replica_ack_timeout_s,
    )
