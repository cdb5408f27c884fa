"""``narwhal-engine-sim``: a light vLLM-compatible engine process (see ``fleet/sim``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web

from fleet.contract import DEFAULT_CONTRACT
from fleet.sim.config import SimConfig
from fleet.sim.server import SimServer
from fleet.sim.state import EngineState

PROCESS_START = time.time()
SHUTDOWN_TIMEOUT_S = 2.0


def parse_args(argv: Sequence[str] | None = None) -> SimConfig:
    ap = argparse.ArgumentParser(prog="narwhal-engine-sim", description=__doc__)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument(
        "--advertise-host", default="", help="remote_host put in KV descriptors (default: --host)"
    )
    ap.add_argument("--model", default="sim-model")
    ap.add_argument("--iid", default="e0")
    ap.add_argument("--version", default="0.11.0")
    ap.add_argument("--kv-layout", default="nixl-v1")
    ap.add_argument(
        "--contract-json", default="", help="engine_contract JSON file (default: DEFAULT_CONTRACT)"
    )
    ap.add_argument("--ttft-base-ms", type=float, default=5.0)
    ap.add_argument("--ttft-per-token-ms", type=float, default=0.05)
    ap.add_argument("--itl-ms", type=float, default=2.0)
    ap.add_argument("--max-concurrency", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-model-len", type=int, default=8192, help="context length reported in /v1/models")
    ap.add_argument(
        "--sse-line-ending", choices=("lf", "crlf", "cr"), default="lf", help="line ends of streamed SSE"
    )
    ap.add_argument("--kv-lease-s", type=int, default=60, help="produced KV blocks expire after this")
    ap.add_argument(
        "--no-attestation",
        dest="attestation",
        action="store_false",
        help="do not serve /v1/attestation (like stock vLLM: a narwhal-attest sidecar serves it)",
    )
    ap.add_argument(
        "--error-rate",
        type=float,
        default=0.0,
        help="a degraded build: this share of requests fails (HTTP 500) from the start, as /sim/faults error_rate",
    )
    a = ap.parse_args(argv)
    contract = dict(DEFAULT_CONTRACT)
    if a.contract_json:
        loaded = json.loads(Path(a.contract_json).read_text(encoding="utf-8"))
        if not isinstance(loaded, dict):
            ap.error("--contract-json must hold a JSON object")
        contract = loaded
    if not 0.0 <= a.error_rate <= 1.0:
        ap.error("--error-rate must be between 0 and 1")
    if a.max_concurrency < 1 or a.kv_lease_s < 1:
        ap.error("--max-concurrency and --kv-lease-s must be >= 1")
    return SimConfig(
        host=a.host,
        port=a.port,
        advertise_host=a.advertise_host,
        model=a.model,
        iid=a.iid,
        version=a.version,
        kv_layout=a.kv_layout,
        contract=contract,
        ttft_base_ms=a.ttft_base_ms,
        ttft_per_token_ms=a.ttft_per_token_ms,
        itl_ms=a.itl_ms,
        max_concurrency=a.max_concurrency,
        seed=a.seed,
        kv_lease_s=a.kv_lease_s,
        sse_line_ending=a.sse_line_ending,
        max_model_len=a.max_model_len,
        attestation=a.attestation,
        error_rate=a.error_rate,
    )


async def serve(cfg: SimConfig) -> None:
    state = EngineState(cfg, PROCESS_START)
    runner = web.AppRunner(SimServer(state).app(), access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port, backlog=1024, reuse_address=True)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"narwhal-engine-sim {cfg.iid} listening on http://{cfg.host}:{cfg.port}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    try:
        import uvloop

        uvloop.run(serve(cfg))
    except ImportError:  # pragma: no cover - uvloop is a declared dependency
        asyncio.run(serve(cfg))
    except OSError as exc:
        print(f"narwhal-engine-sim {cfg.iid}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
