"""``narwhal-serve``: load the fleet file, build the router, serve until SIGTERM/SIGINT.

Exit codes: 0 after a graceful stop, 2 for an unusable fleet file or flag (one line on stderr
naming the problem), 1 when startup fails otherwise.

Settings are resolved once, here, before anything starts: the flags (``RouterOptions``) over the
fleet file, into one frozen ``router.settings.Settings`` that ``serve`` and ``router/assemble.py``
build everything from.

To add a flag: add it in the matching ``_add_*`` group (``dest`` = the ``RouterOptions`` field
name) and the field in ``router/options.py``; nothing else is needed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys
from collections.abc import Sequence
from dataclasses import fields

from aiohttp import web

from router import listeners, observability
from router.assemble import ROUTER_KEY, build
from router.config import ConfigError, FleetConfig, load_fleet
from router.config_keys import startup_report, unused_settings
from router.connections import ConnectionGuard, Listeners, nofile_limit
from router.ha import settings as ha_settings
from router.logs import setup_logging
from router.options import RouterOptions
from router.replicas import settings as replica_settings
from router.serving import fastrelay
from router.serving.front import FrontServer, install_malformed_head_log
from router.settings import Settings, resolve

log = logging.getLogger("narwhal.serve")


def _add_serving_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fleet", required=True, help="fleet file (JSON or YAML, narwhal.fleet v2)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--control-host", dest="control_host", default=None, help="control listener host (default --host)"
    )
    p.add_argument(
        "--control-port",
        dest="control_port",
        type=int,
        default=None,
        help="serve /narwhal/* only on this second listener (overrides control.port; 0 = none)",
    )
    p.add_argument("--journal", default=None, help="request journal path (JSONL)")
    p.add_argument("--max-concurrent", dest="max_concurrent", type=int, default=None)
    p.add_argument("--graceful-timeout", dest="graceful_timeout", type=float, default=None)
    p.add_argument("--log-level", dest="log_level", default="info")
    p.add_argument(
        "--probe-interval",
        dest="probe_interval",
        type=float,
        default=None,
        help="seconds between recovery probes of ejected engines",
    )


def _add_lifecycle_flags(p: argparse.ArgumentParser) -> None:
    """Lifecycle flags (e.g. --resume) go here."""


def _add_ha_flags(p: argparse.ArgumentParser) -> None:
    """HA flags (--lease-path, --router-id, --lease-ttl, --standby-of, ...) go here."""
    ha_settings.add_arguments(p)
    replica_settings.add_arguments(p)  # --ha-mode active-active (router/replicas)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="narwhal-serve", description="Narwhal PD-disaggregated LLM router")
    _add_serving_flags(p)
    _add_lifecycle_flags(p)
    _add_ha_flags(p)
    return p


def options_from_args(ns: argparse.Namespace) -> RouterOptions:
    names = {f.name for f in fields(RouterOptions)}
    return RouterOptions(**{k: v for k, v in vars(ns).items() if k in names})


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        options = options_from_args(ns)
        options.validate()  # flag values, before the fleet file is read
        ha_settings.check_options(options)  # HA: nan/inf lease and standby timings
        config = load_fleet(ns.fleet)
        settings = resolve(config, options)  # once: flags over the fleet file, checked as a whole
    except (ConfigError, ValueError) as exc:
        print(f"narwhal-serve: error: {exc}", file=sys.stderr)
        return 2
    setup_logging(options.log_level)  # httpx per-request lines (standby polls) only at debug
    # once at start-up: what the fleet file sets that this router accepts but does not act on
    log.log(
        logging.WARNING if unused_settings(config) else logging.INFO,
        "%s: %s",
        ns.fleet,
        startup_report(config),
    )
    try:
        import uvloop

        uvloop.run(serve(settings))
    except ConfigError as exc:  # found while building the router (e.g. control token unset)
        print(f"narwhal-serve: error: {exc}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError) as exc:
        print(f"narwhal-serve: error: {exc}", file=sys.stderr)
        return 1
    return 0


GC_YOUNG_THRESHOLD = 20_000


def tune_gc() -> None:
    """Once the router is built: what exists now lives as long as the process (configuration,
    components, routes), so it leaves the cyclic collector's generations (``gc.freeze``), and the
    youngest generation is collected every 20,000 net allocations instead of 700. Request objects
    are freed by reference counting; with the default threshold, collections that found nothing
    cost ~4 % of the router's CPU under load (bench/pd_routers.py, issue 16)."""
    gc.freeze()
    _, mid, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, mid, old)


def client_protocol(
    app: web.Application, runner: web.AppRunner, guard: ConnectionGuard, config: FleetConfig
) -> FrontServer | None:
    """The client listener's own protocol for the completion routes (``serving/front.py``), or None
    (aiohttp serves everything) when requests are traced: the span middleware is aiohttp's."""
    if observability.traces_requests(app):
        log.info("tracing is on: the completion routes are served through aiohttp (server spans)")
        return None
    assert runner.server is not None
    return FrontServer(
        app[ROUTER_KEY].parts.serving,
        runner.server,
        idle_timeout=config.serving.idle_timeout_s,
        max_body=config.serving.max_request_bytes,
        guard=guard,
    )


async def serve(settings: Settings) -> None:
    config, options = settings.fleet, settings.options
    router = build(settings)
    app, core = router.app, router.core
    if warning := listeners.open_control_warning(config, options):
        log.warning("%s", warning)
    if fastrelay.NATIVE_PROBLEM:  # same bytes, more router CPU per relayed token
        log.warning("%s", fastrelay.NATIVE_PROBLEM)
    observability.install(app, core)  # OpenTelemetry only when OTEL_EXPORTER_OTLP_ENDPOINT is set
    install_malformed_head_log()  # a malformed head: one INFO line, not aiohttp's traceback
    graceful = settings.graceful_timeout_s
    guard = ConnectionGuard(config.serving)  # bound, header/idle timeouts, fd reserve
    app[ROUTER_KEY].parts.metrics.extra_metric_sources.append(guard.metric_lines)
    listening = Listeners(guard, graceful)  # our sockets; their stop runs in runner.cleanup()
    listening.install(app)
    runner = web.AppRunner(
        app, shutdown_timeout=graceful, handler_cancellation=True, access_log=None, **guard.runner_kwargs()
    )
    await runner.setup()
    await guard.start()
    tune_gc()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        front = client_protocol(app, runner, guard, config)
        assert runner.server is not None
        await listening.open(runner.server, options.host, options.port, front=front, backlog=2048)
        log.info(
            "client connections bounded at %d (RLIMIT_NOFILE %d, serving.fd_reserve %d); "
            "header timeout %.1fs, idle timeout %.1fs",
            guard.bound,
            nofile_limit(),
            config.serving.fd_reserve,
            config.serving.header_timeout_s,
            config.serving.idle_timeout_s,
        )
        log.info(
            "narwhal-serve listening on http://%s:%d (model %s, %d engines, run %s)",
            options.host,
            options.port,
            config.model,
            len(config.engines),
            core.journal.run_id,
        )
        control = await listeners.start_control_site(runner, config, options, listening)
        if control is not None:
            log.info("control listener on %s (/narwhal/*, /health, /ready, /metrics)", control.url)
        await stop.wait()
        log.info("shutting down: finishing in-flight requests (up to %.1fs)", graceful)
    finally:
        await guard.stop()
        await runner.cleanup()
        observability.shutdown()  # flush spans of the last requests (no-op when not configured)


if __name__ == "__main__":
    sys.exit(main())
