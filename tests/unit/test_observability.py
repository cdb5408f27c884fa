"""``narwhal-serve``'s OpenTelemetry wiring (router/observability.py): without an endpoint nothing is
imported, added or patched; with one, the app gets the server middleware and engine clients are traced.

Each case runs in a child interpreter (instrumentation and the global providers are per process).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_CHILD = textwrap.dedent(
    """
    import sys
    import aiohttp, httpx
    from router.assemble import RouterOptions, build_router
    from router.config import FleetConfig
    from router import observability

    cfg = FleetConfig.model_validate({
        "schema": "narwhal.fleet", "schema_version": 2, "model": "m",
        "engines": [{"iid": "e0", "url": "http://127.0.0.1:1", "role": "prefill"},
                    {"iid": "e1", "url": "http://127.0.0.1:2", "role": "decode"}],
    })
    app, core = build_router(cfg, RouterOptions(journal=sys.argv[1]))
    init, send = aiohttp.ClientSession.__init__, httpx.AsyncHTTPTransport.handle_async_request
    before = len(app.middlewares)
    installed = observability.install(app, core)
    print("installed", installed)
    print("middlewares", len(app.middlewares) - before)
    print("aiohttp patched", aiohttp.ClientSession.__init__ is not init)
    print("httpx patched", httpx.AsyncHTTPTransport.handle_async_request is not send)
    print("instrumentation imported", any(m.startswith("opentelemetry.instrumentation") for m in sys.modules))
    observability.shutdown()
    """
)


def _run(tmp_path: Path, env_overrides: dict[str, str]) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(env_overrides)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "j.jsonl")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_without_endpoint_the_router_is_untouched(tmp_path: Path) -> None:
    assert _run(tmp_path, {}) == [
        "installed False",
        "middlewares 0",
        "aiohttp patched False",
        "httpx patched False",
        "instrumentation imported False",
    ]


def test_with_endpoint_server_and_engine_clients_are_traced(tmp_path: Path) -> None:
    # nothing listens on port 9 and no span is ever finished here, so shutdown has nothing to send
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_METRICS_EXPORTER": "none"}
    assert _run(tmp_path, env) == [
        "installed True",
        "middlewares 1",
        "aiohttp patched True",
        "httpx patched True",
        "instrumentation imported True",
    ]
