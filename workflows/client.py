"""Temporal connection helpers shared by ``narwhal-worker`` and ``narwhal-restart``.

Not a workflow module (never loaded into the sandbox).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError

from router import telemetry

DEFAULT_TASK_QUEUE = "narwhal-restart"
SEARCH_ATTRIBUTES = {
    "NarwhalFleet": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    "NarwhalState": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
}
# For `temporal server start-dev`: the same registrations as flags.
DEV_SERVER_FLAGS = (
    "--search-attribute",
    "NarwhalFleet=Keyword",
    "--search-attribute",
    "NarwhalState=Keyword",
)


def default_address() -> str:
    return os.environ.get("TEMPORAL_ADDRESS", "localhost:7233")


def default_namespace() -> str:
    return os.environ.get("TEMPORAL_NAMESPACE", "default")


class TemporalUnavailable(Exception):
    """The Temporal frontend could not be reached (message names the address and the fix)."""


async def connect(address: str, namespace: str) -> Client:
    """Connect with the pydantic converter; with tracing configured (``setup_tracing`` ran) the
    ``TracingInterceptor`` is added, and workers built from this client inherit it."""
    interceptors = telemetry.temporal_interceptors() if telemetry.tracing_installed() else []
    try:
        return await Client.connect(
            address, namespace=namespace, data_converter=pydantic_data_converter, interceptors=interceptors
        )
    except RuntimeError as exc:  # the core client raises RuntimeError("Failed client connect: …")
        text = str(exc)
        why = "connection refused" if "refused" in text.lower() else text.splitlines()[0][:160]
        raise TemporalUnavailable(
            f"cannot reach Temporal at {address} ({why}); start it (e.g. `temporal server start-dev`) "
            "or point --address / TEMPORAL_ADDRESS at the frontend"
        ) from exc


async def ensure_search_attributes(client: Client, namespace: str) -> list[str]:
    """Register NarwhalFleet/NarwhalState (Keyword) if missing; returns the names added."""
    try:
        existing = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace)
        )
        known = set(existing.custom_attributes) | set(existing.system_attributes)
    except RPCError:
        known = set()
    missing = {k: v for k, v in SEARCH_ATTRIBUTES.items() if k not in known}
    if not missing:
        return []
    try:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=namespace, search_attributes=missing)
        )
    except RPCError as exc:
        if "already" not in str(exc).lower():
            raise
    return sorted(missing)


def console_exit(code: int) -> NoReturn:
    """Exit a console command without interpreter finalisation, which can abort (SIGABRT,
    ``PyGILState_Release``) while the Temporal core runtime's threads are alive. Callers flush their
    spans first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def console_main(entry: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None) -> int:
    """Run a CLI's ``entry``; as a console command (``argv`` None) end with ``console_exit``."""
    code = entry(argv)
    if argv is None:
        console_exit(code)
    return code
