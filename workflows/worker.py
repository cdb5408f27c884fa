"""``narwhal-worker``: runs the restart workflows and their activities.

    narwhal-worker [--task-queue narwhal-restart] [--address HOST:PORT] [--namespace NS]
        [--config worker.json] [--router NAME=URL[,URL]] [--router-token-env NAME=VAR]
        [--template NAME=COMMAND] [--tls] [--tls-ca-cert PATH] [--tls-cert PATH --tls-key PATH]
        [--tls-server-name NAME] [--api-key-file PATH]

Defaults come from ``TEMPORAL_ADDRESS`` / ``TEMPORAL_NAMESPACE``; TLS / API key from the SDK's
``TEMPORAL_TLS_*`` / ``TEMPORAL_API_KEY`` (workflows/client.py). SIGTERM/SIGINT shut the worker
down gracefully (running activities get ``--grace`` seconds, then are retried by another worker).
A worker that dies without that (SIGKILL) leaves the workflow tasks handed to its sticky queue: they
go back to the task queue after ``--sticky-timeout`` seconds (10, the SDK's default).
The routers this worker may call, their control tokens and the command templates it may run are
its own configuration (activities/worker_config.py): workflow input only names them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from datetime import timedelta

import httpx
from temporalio.client import Client
from temporalio.worker import Worker

from activities.evidence import EvidenceActivities
from activities.preflight import PreflightActivities, fleet_lock_owner
from activities.router import LifecycleActivities, LifecycleClient
from activities.supervisor import SupervisorActivities
from activities.worker_config import WorkerConfigError, WorkerSettings, add_flags, flag_overrides
from router import telemetry
from router.logs import setup_logging
from workflows.client import (
    DEFAULT_TASK_QUEUE,
    Security,
    TemporalUnavailable,
    add_connection_flags,
    connect,
    console_main,
    default_address,
    default_namespace,
    ensure_search_attributes,
    security,
)
from workflows.restart import EngineRestart, FleetLock, RollingRestart, WaveRestart

log = logging.getLogger("narwhal.worker")
SERVICE_NAME = "narwhal-worker"
# The SDK's default: a workflow task handed to this worker's sticky queue waits this long for it
# before it goes back to the task queue (where any worker replays the history and takes it).
STICKY_TIMEOUT = timedelta(seconds=10)


def positive_seconds(value: str) -> float:
    """argparse type: a number of seconds > 0."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds: {value!r}")
    return seconds


def log_level(value: str) -> str:
    """argparse type for ``--log-level``: any case (``warning``, ``WARN``, ``Debug``)."""
    name = value.strip().upper()
    name = {"WARN": "WARNING", "FATAL": "CRITICAL"}.get(name, name)
    if name not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise argparse.ArgumentTypeError(
            f"unknown log level {value!r} (debug, info, warning, error, critical)"
        )
    return name


def build_worker(
    client: Client,
    task_queue: str,
    http: httpx.AsyncClient,
    settings: WorkerSettings,
    grace: timedelta = timedelta(seconds=10),
    sticky_timeout: timedelta = STICKY_TIMEOUT,
) -> Worker:
    lifecycle = LifecycleActivities(LifecycleClient(http, settings))
    supervisor = SupervisorActivities(http, settings)
    preflight = PreflightActivities(lifecycle.client)
    evidence = EvidenceActivities(lifecycle.client)
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[EngineRestart, RollingRestart, WaveRestart, FleetLock],
        activities=[
            lifecycle.read_fleet,
            lifecycle.drain,
            lifecycle.wait_ready_to_stop,
            lifecycle.readmit,
            lifecycle.confirm_active,
            preflight.preflight,
            fleet_lock_owner,
            supervisor.probe_process,
            supervisor.restart_engine,
            supervisor.wait_new_process,
            supervisor.start_engine,
            supervisor.rollback_engine,
            evidence.sample_evidence,
        ],
        graceful_shutdown_timeout=grace,
        sticky_queue_schedule_to_start_timeout=sticky_timeout,
    )


async def serve(
    address: str,
    namespace: str,
    task_queue: str,
    grace_s: float,
    settings: WorkerSettings,
    sticky_timeout_s: float = 10.0,
    sec: Security | None = None,
) -> None:
    client = await connect(address, namespace, sec)
    added = await ensure_search_attributes(client, namespace)
    if added:
        log.info("registered search attributes %s", added)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with httpx.AsyncClient() as http:
        if telemetry.tracing_installed():
            telemetry.instrument_httpx(http)  # activities' router/supervisor/engine calls carry traceparent
        # The client's TracingInterceptor (workflows.client.connect) also intercepts this worker.
        worker = build_worker(
            client,
            task_queue,
            http,
            settings,
            timedelta(seconds=grace_s),
            timedelta(seconds=sticky_timeout_s),
        )
        cfg = settings.current()
        async with worker:
            log.info(
                "narwhal-worker polling %s on %s/%s; routers %s, templates %s",
                task_queue, address, namespace, sorted(cfg.routers) or "none", sorted(cfg.templates) or "none",
            )  # fmt: skip
            print(f"narwhal-worker ready: task queue {task_queue} on {address} ({namespace})", flush=True)
            await stop.wait()
            log.info("shutting down")
    print("narwhal-worker stopped", flush=True)


def _main(argv: Sequence[str] | None) -> int:
    p = argparse.ArgumentParser(prog="narwhal-worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--task-queue", default=DEFAULT_TASK_QUEUE)
    p.add_argument("--address", default=default_address(), help="Temporal frontend (env TEMPORAL_ADDRESS)")
    p.add_argument("--namespace", default=default_namespace(), help="(env TEMPORAL_NAMESPACE)")
    p.add_argument(
        "--grace", type=float, default=10.0, help="graceful shutdown seconds for running activities"
    )
    p.add_argument(
        "--sticky-timeout",
        type=positive_seconds,
        default=STICKY_TIMEOUT.total_seconds(),
        help="seconds a workflow task waits on this worker's sticky queue before any worker may take "
        "it (a worker killed mid-restart is replaced after this long)",
    )
    p.add_argument("--log-level", type=log_level, default="INFO", help="debug|info|warning|error (any case)")
    add_flags(p)
    add_connection_flags(p)
    args = p.parse_args(argv)
    setup_logging(args.log_level)  # the activities' per-poll httpx lines only at debug
    try:
        settings = WorkerSettings(args.config, flag_overrides(args))
    except WorkerConfigError as exc:
        print(f"narwhal-worker: error: {exc}", file=sys.stderr)
        return 2
    telemetry.setup_tracing(SERVICE_NAME)  # no-op unless OTEL_EXPORTER_OTLP_ENDPOINT is set
    try:
        sec = security(args)
        asyncio.run(
            serve(
                args.address, args.namespace, args.task_queue, args.grace, settings, args.sticky_timeout, sec
            )
        )
    except TemporalUnavailable as exc:
        print(f"narwhal-worker: error: {exc}", file=sys.stderr)
        return 2
    finally:
        telemetry.shutdown_telemetry()  # flush workflow/activity spans still buffered
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return console_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
