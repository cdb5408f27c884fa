"""``narwhal-attest``: serve a process-bound ``narwhal.attestation`` v1 document for one engine.

    narwhal-attest --engine-url http://127.0.0.1:8100 --engine-pid 4242 --contract contract.json \\
        --host 127.0.0.1 --port 8101

``--contract FILE`` holds the fleet's ``engine_contract`` object as JSON (or a whole ``narwhal.fleet``
file). Exit codes: 2 for unusable input (unreadable or incomplete contract, unknown PID, bad
flag), 1 when the listener cannot start, 0 after SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import signal
import sys
from collections.abc import Sequence
from urllib.parse import urlsplit

from aiohttp import web

from fleet.attest import proc
from fleet.attest.binding import ContractError, load_contract
from fleet.attest.server import Settings, Sidecar
from router.logs import setup_logging

log = logging.getLogger("narwhal.attest")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="narwhal-attest", description="Attestation sidecar for one engine")
    p.add_argument("--engine-url", required=True, help="engine base URL (e.g. http://127.0.0.1:8100)")
    p.add_argument("--engine-pid", type=int, default=None, help="engine process ID (binds its /proc start)")
    p.add_argument("--contract", required=True, help="engine_contract JSON file (or a narwhal.fleet file)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8101)
    p.add_argument("--engine-api-key-env", default="", help="env var with the engine's API key")
    p.add_argument("--timeout", type=float, default=5.0, help="engine read timeout (s)")
    p.add_argument("--bind-interval", type=float, default=1.0, help="retry binding every S seconds")
    p.add_argument(
        "--max-start-skew",
        type=float,
        default=60.0,
        help="with --engine-pid: largest accepted gap between the PID's start and the engine's own",
    )
    p.add_argument("--log-level", default="info")
    return p


def settings_from_args(ns: argparse.Namespace) -> Settings:
    """Validated settings; ValueError / ContractError / ProcessGone name the problem (exit 2)."""
    parts = urlsplit(ns.engine_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--engine-url {ns.engine_url!r} is not an http(s) URL")
    for flag in ("timeout", "bind_interval", "max_start_skew"):
        v = getattr(ns, flag)
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be finite and > 0")
    if not 0 < ns.port <= 65535:
        raise ValueError(f"--port {ns.port} is not a TCP port")
    if ns.engine_pid is not None:
        if ns.engine_pid <= 0:
            raise ValueError(f"--engine-pid {ns.engine_pid} is not a process ID")
        proc.start_time(ns.engine_pid)  # ProcessGone: unknown PID
    return Settings(
        engine_url=ns.engine_url.rstrip("/"),
        contract=load_contract(ns.contract),
        pid=ns.engine_pid,
        api_key_env=ns.engine_api_key_env,
        timeout_s=ns.timeout,
        bind_interval_s=ns.bind_interval,
        max_start_skew_s=ns.max_start_skew,
    )


async def serve(settings: Settings, host: str, port: int) -> None:
    sidecar = Sidecar(settings)
    runner = web.AppRunner(sidecar.app(), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await web.TCPSite(runner, host, port, reuse_address=True).start()
        log.info("narwhal-attest for %s listening on http://%s:%d", settings.engine_url, host, port)
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        settings = settings_from_args(ns)
    except (ValueError, ContractError, proc.ProcessGone) as exc:
        print(f"narwhal-attest: error: {exc}", file=sys.stderr)
        return 2
    setup_logging(ns.log_level)  # its per-request httpx calls to the engine only at debug
    try:
        asyncio.run(serve(settings, ns.host, ns.port))
    except OSError as exc:
        print(f"narwhal-attest: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
