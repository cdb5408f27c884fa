"""``GET /narwhal/targets``: Prometheus HTTP service discovery of the engines (spec §1).

One entry per configured engine (sorted by ID, whatever its state: a drained or ejected engine is
still scraped), ``targets: ["host:port"]`` and the labels ``iid``, ``role`` (current router-side
role), ``__scheme__``, ``__metrics_path__`` and ``__meta_narwhal_url`` (the engine base URL;
Prometheus drops ``__meta_*`` labels after relabeling). Pure: built from the scheduler.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from router.config import Role
from router.scheduler import EngineRuntime

_DEFAULT_PORTS = {"http": 80, "https": 443}


class TargetLabels(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    iid: str
    role: Role
    scheme: str = Field(alias="__scheme__")
    metrics_path: str = Field(alias="__metrics_path__")
    url: str = Field(alias="__meta_narwhal_url")


class Target(BaseModel):
    model_config = ConfigDict(extra="forbid")

    targets: list[str] = Field(min_length=1, max_length=1)
    labels: TargetLabels


TARGETS = TypeAdapter(list[Target])


def address(url: str) -> tuple[str, str, str]:
    """(scheme, "host:port", path) of an engine base URL; the port defaults from the scheme."""
    parts = urlsplit(url)
    scheme = parts.scheme or "http"
    host = parts.hostname or ""
    port = parts.port or _DEFAULT_PORTS.get(scheme, 80)
    shown = f"[{host}]" if ":" in host else host
    return scheme, f"{shown}:{port}", parts.path.rstrip("/")


def target(engine: EngineRuntime) -> Target:
    scheme, hostport, path = address(engine.url)
    labels = TargetLabels(
        iid=engine.iid, role=engine.role, scheme=scheme, metrics_path=f"{path}/metrics", url=engine.url
    )
    return Target(targets=[hostport], labels=labels)


def build_targets(engines: Iterable[EngineRuntime]) -> list[Target]:
    return [target(e) for e in sorted(engines, key=lambda e: e.iid)]


def targets_json(engines: Iterable[EngineRuntime]) -> bytes:
    return TARGETS.dump_json(build_targets(engines), by_alias=True)
