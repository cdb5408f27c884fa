"""``Settings``: everything a router process is configured with, resolved once.

``resolve`` merges the ``narwhal-serve`` flags (``RouterOptions``) over the fleet file
(``FleetConfig``; environment variables are named there, e.g. ``ha.etcd_password_env``) with the
precedence flags > fleet file > defaults, checks the result as a whole (``ValueError`` /
``ConfigError``: the CLI exits 2 with one line) and returns one frozen value. ``router/cli.py``
resolves it once, before anything starts, and hands it to ``router/assemble.py``, which builds every
component from its typed parts: no component reads the flags or an argparse namespace itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from router.config import FleetConfig
from router.ha import settings as ha_settings
from router.ha.settings import HARuntime
from router.listeners import ControlListener, control_listener
from router.options import RouterOptions
from router.replicas import wiring as replica_wiring
from router.replicas.service import ReplicaSettings


@dataclass(frozen=True)
class Settings:
    """One router process's resolved settings (flags over the fleet file)."""

    fleet: FleetConfig
    options: RouterOptions  # the flags as given (host/port of the client listener, log level)
    ha: HARuntime  # lease, handoff state file, standby (router/ha)
    replica: ReplicaSettings | None  # active-active membership, None in active-passive mode
    control: ControlListener | None  # the separate control listener, None when there is none
    journal: Path  # --journal, else next to profiles.path
    seats: int  # in-flight request seats: --max-concurrent, else serving.max_connections
    graceful_timeout_s: float  # --graceful-timeout, else serving.graceful_timeout_s
    probe_interval_s: float | None  # --probe-interval, else None (monitor_interval × readmit_every)

    @property
    def etcd_endpoints(self) -> str:
        return self.ha.etcd_endpoints


def journal_path(config: FleetConfig, options: RouterOptions) -> Path:
    if options.journal:
        return Path(options.journal)
    profiles = (config.profiles or {}).get("path", "runs/profiles.json")
    return Path(str(profiles)).parent / "journal.jsonl"


def resolve(config: FleetConfig, options: RouterOptions | None = None) -> Settings:
    """The settings of a router for ``config`` and ``options``; ``ValueError``/``ConfigError``."""
    options = options or RouterOptions()
    options.validate()
    ha = ha_settings.from_options(config, options, port=options.port)
    replica, _ = replica_wiring.settings_for(config, options, ha)  # active-active needs etcd
    return Settings(
        fleet=config,
        options=options,
        ha=ha,
        replica=replica,
        control=control_listener(config, options),
        journal=journal_path(config, options),
        seats=options.max_concurrent or config.serving.max_connections,
        graceful_timeout_s=(
            options.graceful_timeout
            if options.graceful_timeout is not None
            else config.serving.graceful_timeout_s
        ),
        probe_interval_s=options.probe_interval,
    )
