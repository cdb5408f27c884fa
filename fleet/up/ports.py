"""Port plan of a ``narwhal-up`` stack and the up-front check that every port is free.

With ``--base-port B`` every port is derived from ``B`` (see ``OFFSETS``); without it the
well-known defaults apply (Temporal 7233, UI 8233, router 8000, ...). An individual flag always wins.
Nothing is started before ``busy_ports`` found every port bindable on the host.
"""

from __future__ import annotations

import errno
import os
import random
import socket
import time
from dataclasses import dataclass, fields

# field -> (default port, offset from --base-port, flag)
OFFSETS: dict[str, tuple[int, int, str]] = {
    "temporal": (7233, 0, "--temporal-port"),
    "temporal_http": (7243, 1, "--temporal-http-port"),
    "temporal_metrics": (7253, 2, "--temporal-metrics-port"),
    "ui": (8233, 3, "--ui-port"),
    "supervisor": (8900, 4, "--supervisor-port"),
    "router": (8000, 5, "--router-port"),
    "standby": (8001, 6, "--standby-port"),
    "etcd_client": (2379, 7, "--etcd-port"),  # only with --etcd
    "etcd_peer": (2380, 8, "--etcd-peer-port"),  # only with --etcd
    "engine_base": (8100, 10, "--engine-base-port"),
}


@dataclass(frozen=True)
class Ports:
    temporal: int
    temporal_http: int
    temporal_metrics: int
    ui: int
    supervisor: int
    router: int
    standby: int
    etcd_client: int
    etcd_peer: int
    engine_base: int
    engines: int  # how many engine ports, starting at engine_base
    with_etcd: bool = False  # the etcd ports are part of the plan only with --etcd
    replicas: int = 0  # --replicas N: router, standby, then router + 50 + k for replica k >= 2

    def replica_ports(self) -> list[int]:
        return [self.router, self.standby, *(self.router + 50 + k for k in range(2, self.replicas))][
            : self.replicas
        ]

    def engine_ports(self) -> list[int]:
        return [self.engine_base + i for i in range(self.engines)]

    def named(self) -> list[tuple[str, int, str]]:
        """(what, port, flag that moves it) for every port of the plan."""
        out = [(f.name, getattr(self, f.name), OFFSETS[f.name][2]) for f in fields(self) if f.name in OFFSETS]
        out = [o for o in out if o[0] != "engine_base"]
        if not self.with_etcd:
            out = [o for o in out if o[0] not in ("etcd_client", "etcd_peer")]
        out += [(f"engine e{i}", p, "--engine-base-port") for i, p in enumerate(self.engine_ports())]
        out += [(f"replica {k}", p, "--router-port") for k, p in enumerate(self.replica_ports()) if k >= 2]
        return out


def plan_ports(
    base: int | None,
    engines: int,
    overrides: dict[str, int | None],
    with_etcd: bool = False,
    replicas: int = 0,
) -> Ports:
    """Defaults, or ``base + offset``; ``overrides`` (field -> port or None) win."""
    values: dict[str, int] = {}
    for name, (default, offset, _flag) in OFFSETS.items():
        chosen = overrides.get(name)
        values[name] = chosen if chosen is not None else (default if base is None else base + offset)
    return Ports(engines=engines, with_etcd=with_etcd, replicas=replicas, **values)


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when ``host:port`` can be bound now (SO_REUSEADDR, as the servers themselves bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
                return False
            raise
    return True


def port_problems(ports: Ports, host: str = "127.0.0.1") -> list[str]:
    """Operator-facing lines for every invalid, duplicated or busy port (empty = all good)."""
    problems: list[str] = []
    seen: dict[int, str] = {}
    for what, port, flag in ports.named():
        if not 0 < port < 65536:
            problems.append(f"{what} port {port} is out of range; pass {flag} N or --base-port N")
            continue
        if port in seen:
            problems.append(f"{what} and {seen[port]} would both use port {port}; pass {flag} N")
            continue
        seen[port] = what
        if not port_free(port, host):
            problems.append(f"{what} port {port} is in use; pass {flag} N or --base-port N")
    return problems


# -- free ports for a stack on free loopback ports (the chaos drill, tests, benchmarks) -----------

_handed_out: set[int] = set()
_rng = random.Random(os.getpid() ^ time.monotonic_ns())


def _port_range() -> tuple[int, int]:
    """20000-32000, or this pytest-xdist worker's own slice of it (``gw0`` … ``gwN``).

    Parallel test workers are separate processes that cannot see each other's handed-out ports;
    a disjoint slice each means one worker never picks a port another has picked and not yet bound.
    """
    low, high = 20000, 32000
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or "1")
    if worker.startswith("gw") and worker[2:].isdigit() and count > 1:
        width = (high - low) // count
        low += int(worker[2:]) * width
        high = low + width
    return low, high


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range (32768+), never handed out twice.

    Ports from the ephemeral range can be taken by any outgoing connection between the moment a
    test picks one and the moment its server binds it; ports below that range cannot.
    """
    low, high = _port_range()
    for _ in range(200):
        port = _rng.randrange(low, high)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free loopback port found in {low}-{high}")
