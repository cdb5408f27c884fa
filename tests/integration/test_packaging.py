"""What ships: the wheel and the router image carry the product, never the test-and-bench support.

The support (``narwhal_testing/``: etcd cluster spawner, TCP proxies, fake restart activities, …)
lives in the source tree only. The wheel is built here for real (setuptools' PEP 517 backend from
the venv, no network) from a copy of the checkout, so the checkout gets no ``build/`` directory.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SUPPORT_DIRS = {"narwhal_testing", "testing", "tests", "bench"}
# Classes only test support defines (the etcd spawner, proxies, fake activities, drills' handles).
SUPPORT_CLASSES = {
    "EtcdCluster",
    "TlsEtcd",
    "TcpProxy",
    "RechunkProxy",
    "FakeFleet",
    "SmallFs",
    "RouterHandle",
}
SHIPPED = ("router/cli.py", "workflows/worker.py", "activities/router.py", "narwhal_models/restart.py")

pytestmark = pytest.mark.integration


def _classes(source: str) -> set[str]:
    return {n.name for n in ast.parse(source).body if isinstance(n, ast.ClassDef)}


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every .py file of the wheel built from this checkout (name -> source)."""
    src = tmp_path_factory.mktemp("src") / "narwhal"
    ignore = shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", "*.egg-info", "build", "*.so", ".*_cache", ".hypothesis", "runs"
    )
    shutil.copytree(REPO, src, ignore=ignore)
    out = tmp_path_factory.mktemp("wheel")
    # CC=false: the optional C relay (setup.py) is skipped; it is one .so, not what this test reads.
    env = {**os.environ, "CC": "false"}
    build = f"from setuptools import build_meta; print(build_meta.build_wheel({str(out)!r}))"
    proc = subprocess.run(
        [sys.executable, "-c", build], cwd=src, env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        return {n: z.read(n).decode("utf-8") for n in z.namelist() if n.endswith(".py")}


def test_the_wheel_carries_the_product_and_no_test_support(wheel_files: dict[str, str]) -> None:
    assert set(SHIPPED) <= set(wheel_files), "the wheel misses shipped modules"
    support = sorted(n for n in wheel_files if SUPPORT_DIRS & set(Path(n).parts[:-1]))
    assert support == []
    defining = {n: sorted(_classes(s) & SUPPORT_CLASSES) for n, s in wheel_files.items()}
    assert {n: c for n, c in defining.items() if c} == {}
    importing = sorted(
        n for n, s in wheel_files.items() if re.search(r"^\s*(from|import) narwhal_testing\b", s, re.M)
    )
    assert importing == [], "shipped modules import test support"


def _dockerfile_sources() -> list[str]:
    sources: list[str] = []
    for line in (REPO / "Dockerfile").read_text(encoding="utf-8").splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            sources += [w for w in words[1:-1] if not w.startswith("--")]
    return sources


def test_the_router_image_is_given_no_test_support() -> None:
    sources = _dockerfile_sources()
    assert "router" in sources and "fleet" in sources, sources  # the parse saw the COPY lines
    assert "." not in sources and "./" not in sources, "the Dockerfile copies the whole checkout"
    assert not SUPPORT_DIRS & {s.rstrip("/") for s in sources}
    ignored = set((REPO / ".dockerignore").read_text(encoding="utf-8").split())
    assert {"narwhal_testing", "tests", "bench"} <= ignored
    for source in sources:
        path = REPO / source
        files = sorted(path.rglob("*.py")) if path.is_dir() else []
        assert not [f for f in files if SUPPORT_DIRS & set(f.relative_to(REPO).parts[:-1])]
        assert not [f for f in files if _classes(f.read_text(encoding="utf-8")) & SUPPORT_CLASSES]
