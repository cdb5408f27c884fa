"""``narwhal-worker``: runs the restart workflows and their activities.

    narwhal-worker [--task-queue narwhal-restart] [--address HOST:PORT] [--namespace NS]

Defaults come from ``TEMPORAL_ADDRESS`` / ``TEMPORAL_NAMESPACE``. SIGTERM/SIGINT shut the worker
down gracefully (running activities get ``--grace`` seconds, then are retried by another worker).
Router control tokens are read from the environment variables the workflows name.
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

from activities.router import LifecycleActivities, LifecycleClient
from activities.supervisor import SupervisorActivities
from router import telemetry
from router.logs import setup_logging
from workflows.client import (
    DEFAULT_TASK_QUEUE,
    TemporalUnavailable,
    connect,
    console_main,
    default_address,
    default_namespace,
    ensure_search_attributes,
)
from workflows.restart import EngineRestart, RollingRestart, WaveRestart

log = logging.getLogger("narwhal.worker")
SERVICE_NAME = "narwhal-worker"


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
    client: Client, task_queue: str, http: httpx.AsyncClient, grace: timedelta = timedelta(seconds=10)
) -> Worker:
    lifecycle = LifecycleActivities(LifecycleClient(http))
    supervisor = SupervisorActivities(http)
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[EngineRestart, RollingRestart, WaveRestart],
        activities=[
            lifecycle.read_fleet,
            lifecycle.drain,
            lifecycle.wait_ready_to_stop,
            lifecycle.readmit,
            lifecycle.confirm_active,
            supervisor.probe_process,
            supervisor.restart_engine,
            supervisor.wait_new_process,
            supervisor.start_engine,
        ],
        graceful_shutdown_timeout=grace,
    )


async def serve(address: str, namespace: str, task_queue: str, grace_s: float) -> None:
    client = await connect(address, namespace)
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
        worker = build_worker(client, task_queue, http, timedelta(seconds=grace_s))
        async with worker:
            log.info("narwhal-worker polling %s on %s/%s", task_queue, address, namespace)
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
    p.add_argument("--log-level", type=log_level, default="INFO", help="debug|info|warning|error (any case)")
    args = p.parse_args(argv)
    setup_logging(args.log_level)  # the activities' per-poll httpx lines only at debug
    telemetry.setup_tracing(SERVICE_NAME)  # no-op unless OTEL_EXPORTER_OTLP_ENDPOINT is set
    try:
        asyncio.run(serve(args.address, args.namespace, args.task_queue, args.grace))
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
