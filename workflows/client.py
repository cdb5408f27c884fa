"""Temporal connection helpers shared by ``narwhal-worker`` and ``narwhal-restart``.

TLS, mTLS and API key come from the SDK's own environment configuration
(``temporalio.envconfig``: ``TEMPORAL_TLS``, ``TEMPORAL_TLS_SERVER_CA_CERT_PATH``/``_DATA``,
``TEMPORAL_TLS_CLIENT_CERT_PATH``/``_DATA``, ``TEMPORAL_TLS_CLIENT_KEY_PATH``/``_DATA``,
``TEMPORAL_TLS_SERVER_NAME``, ``TEMPORAL_API_KEY``, ``TEMPORAL_CONFIG_FILE``/``TEMPORAL_PROFILE``)
and flags that win over it (``--tls``, ``--tls-ca-cert``, ``--tls-cert``, ``--tls-key``,
``--tls-server-name``, ``--api-key-file``). ``connect`` is the one way both commands connect.

Not a workflow module (never loaded into the sandbox).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.envconfig import ClientConfigProfile
from temporalio.service import RPCError, TLSConfig

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


@dataclass(frozen=True)
class Security:
    """How to reach the frontend: ``tls`` False (plain), True (system roots) or a ``TLSConfig``."""

    tls: bool | TLSConfig = False
    api_key: str | None = None

    def describe(self) -> str:
        parts = []
        if isinstance(self.tls, TLSConfig):
            parts.append("mTLS" if self.tls.client_cert else "TLS")
        elif self.tls:
            parts.append("TLS")
        if self.api_key:
            parts.append("API key")
        return " + ".join(parts) or "plaintext"


def add_connection_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "Temporal TLS / API key (flags win over the SDK's TEMPORAL_TLS_* / TEMPORAL_API_KEY)"
    )
    g.add_argument("--tls", action="store_true", default=None, help="TLS to the frontend (system roots)")
    g.add_argument("--tls-ca-cert", default="", metavar="PATH", help="CA certificate of the frontend")
    g.add_argument("--tls-cert", default="", metavar="PATH", help="client certificate (mTLS)")
    g.add_argument("--tls-key", default="", metavar="PATH", help="client private key (mTLS)")
    g.add_argument(
        "--tls-server-name", default="", metavar="NAME", help="name the certificate is checked for"
    )
    g.add_argument(
        "--api-key-file", default="", metavar="PATH", help="file holding the API key (implies TLS)"
    )


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise TemporalUnavailable(f"{what} {path}: {exc.strerror or exc}") from None


def security(args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None) -> Security:
    """The SDK's environment configuration (``temporalio.envconfig``), then the flags over it."""
    try:
        profile = ClientConfigProfile.load(override_env_vars=env)
        cfg = profile.to_client_connect_config()
    except (RuntimeError, ValueError, OSError) as exc:
        raise TemporalUnavailable(
            f"Temporal client configuration (TEMPORAL_* / config file): {exc}"
        ) from None
    tls = cfg.get("tls", False)
    api_key = cfg.get("api_key")
    if args is None:
        return Security(tls=tls, api_key=api_key)
    ca = _read(args.tls_ca_cert, "--tls-ca-cert") if args.tls_ca_cert else None
    cert = _read(args.tls_cert, "--tls-cert") if args.tls_cert else None
    key = _read(args.tls_key, "--tls-key") if args.tls_key else None
    if bool(cert) != bool(key) and not isinstance(tls, TLSConfig):
        raise TemporalUnavailable("--tls-cert and --tls-key go together (mTLS)")
    if args.api_key_file:
        api_key = _read(args.api_key_file, "--api-key-file").decode().strip()
    if ca or cert or key or args.tls_server_name or args.tls:
        base = tls if isinstance(tls, TLSConfig) else TLSConfig()
        tls = TLSConfig(
            server_root_ca_cert=ca or base.server_root_ca_cert,
            client_cert=cert or base.client_cert,
            client_private_key=key or base.client_private_key,
            domain=args.tls_server_name or base.domain,
        )
    elif api_key and tls is False and "tls" not in cfg:
        tls = True
    return Security(tls=tls, api_key=api_key)


async def connect(address: str, namespace: str, sec: Security | None = None) -> Client:
    """Connect with the pydantic converter; with tracing configured (``setup_tracing`` ran) the
    ``TracingInterceptor`` is added, and workers built from this client inherit it. ``sec`` None:
    TLS / API key from the SDK's environment configuration only."""
    sec = sec if sec is not None else security()
    interceptors = telemetry.temporal_interceptors() if telemetry.tracing_installed() else []
    try:
        return await Client.connect(
            address, namespace=namespace, data_converter=pydantic_data_converter, interceptors=interceptors,
            tls=sec.tls, api_key=sec.api_key,
        )  # fmt: skip
    except RuntimeError as exc:  # the core client raises RuntimeError("Failed client connect: …")
        text = str(exc)
        why = "connection refused" if "refused" in text.lower() else " ".join(text.split())[:300]
        hint = (
            "; the frontend may require TLS (--tls / TEMPORAL_TLS, --tls-ca-cert …)"
            if sec.tls is False and "refused" not in text.lower()
            else ""
        )
        over = "" if sec.tls is False and not sec.api_key else f" over {sec.describe()}"
        raise TemporalUnavailable(
            f"cannot reach Temporal at {address} ({why}){over}{hint}; start it "
            "(e.g. `temporal server start-dev`) or point --address / TEMPORAL_ADDRESS at the frontend"
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
