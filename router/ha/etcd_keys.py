"""The etcd key layout under the HA prefix and the documents stored there (one owner for both).

Keys under the prefix (default ``/narwhal/<model>/``, ``default_prefix``; see docs/ha.md):

- ``<prefix>holder`` — ``narwhal.etcd-holder`` v1 (``HolderDoc``: holder token, epoch, router id)
  on an etcd lease; written by the etcd lease backend (``router/ha/etcd_lease.py``), watched by
  every active-active replica for the holder's router id (``holder_router_id``).
- ``<prefix>epoch`` — the last epoch ever claimed (decimal; ``parse_epoch``).
- ``<prefix>handoff`` — the holder's ``narwhal.handoff`` v1 (``router/ha/handoff.py``;
  ``parse_handoff``), fenced by the holder key; its revision is active-active's lifecycle version.
- ``<prefix>replicas/<replica-id>`` — an active-active replica's ``narwhal.replica`` v1
  (``router/replicas/member.py``) on that replica's own short etcd lease.

``EtcdKeys`` names them for one prefix; the lease backend and ``router/replicas/service.py`` both
take their keys from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from router.ha.etcd_client import KeyValue
from router.ha.handoff import Handoff, HandoffError, validate
from router.ha.lease import LeaseError

HOLDER_SCHEMA = "narwhal.etcd-holder"


class EtcdKeyRefused(LeaseError):
    """A key under the prefix holds a document this router did not write and will not touch."""


class HolderDoc(BaseModel):
    """``narwhal.etcd-holder`` v1: the value of ``<prefix>holder``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_: Literal["narwhal.etcd-holder"] = Field(default="narwhal.etcd-holder", alias="schema")
    schema_version: Literal[1] = 1
    holder: StrictStr = Field(min_length=1)
    epoch: StrictInt = Field(ge=1)
    router_id: StrictStr
    claimed_at: float

    def encode(self) -> bytes:
        return json.dumps(self.model_dump(by_alias=True), sort_keys=True).encode()


class HolderRouterId(BaseModel):
    """The one field a replica reads of ``<prefix>holder`` (any other content is the backend's)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    router_id: StrictStr = ""


def default_prefix(model: str) -> str:
    """``/narwhal/<model>/`` with the model name made key-safe."""
    safe = "".join(c if c.isalnum() or c in "-_.:" else "_" for c in model) or "model"
    return f"/narwhal/{safe}/"


def check_prefix(prefix: str) -> str:
    if not prefix.startswith("/") or not prefix.endswith("/") or "//" in prefix:
        raise ValueError(f"etcd prefix {prefix!r} must start and end with '/' (e.g. /narwhal/<model>/)")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in prefix):
        raise ValueError(f"etcd prefix {prefix!r} must not contain spaces or control characters")
    return prefix


@dataclass(frozen=True, slots=True)
class EtcdKeys:
    """The keys under one HA prefix (the prefix ends in "/")."""

    prefix: str

    @property
    def holder(self) -> bytes:
        return f"{self.prefix}holder".encode()

    @property
    def epoch(self) -> bytes:
        return f"{self.prefix}epoch".encode()

    @property
    def handoff(self) -> bytes:
        return f"{self.prefix}handoff".encode()

    @property
    def replicas(self) -> bytes:
        """The membership keys' common prefix."""
        return f"{self.prefix}replicas/".encode()

    def replica(self, replica_id: str) -> bytes:
        return self.replicas + replica_id.encode()

    def replica_id(self, key: bytes) -> str:
        """The replica id of a membership key."""
        return key[len(self.replicas) :].decode(errors="replace")

    @property
    def state_range_end(self) -> bytes:
        """``handoff`` and ``holder`` share the range [``handoff``, ``holder`` + NUL)."""
        return self.holder + b"\x00"


def parse_holder(kv: KeyValue) -> HolderDoc:
    try:
        return HolderDoc.model_validate_json(kv.value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "document"
        raise EtcdKeyRefused(
            f"etcd key {kv.key.decode(errors='replace')} holds a foreign or torn document "
            f"({where}: {first['msg']}); not touched"
        ) from None


def holder_router_id(raw: bytes) -> str:
    """The ``router_id`` of the holder document ("" when unreadable)."""
    try:
        return HolderRouterId.model_validate_json(raw).router_id
    except ValidationError:
        return ""


def parse_epoch(kv: KeyValue | None) -> int:
    if kv is None:
        return 0
    text = kv.value.decode("ascii", errors="replace").strip()
    if not text.isdigit() or int(text) < 1:
        raise EtcdKeyRefused(
            f"etcd key {kv.key.decode(errors='replace')} holds {text[:40]!r}, not an epoch counter; not touched"
        )
    return int(text)


def parse_handoff(kv: KeyValue, model: str) -> Handoff:
    """The stored handoff; ``EtcdKeyRefused`` for a foreign, torn or other-model document."""
    name = kv.key.decode(errors="replace")
    try:
        doc = validate(json.loads(kv.value.decode("utf-8")))
    except (UnicodeDecodeError, ValueError, HandoffError) as exc:
        raise EtcdKeyRefused(
            f"etcd key {name} holds a foreign or torn document ({exc}); not touched"
        ) from None
    if doc.model != model:
        raise EtcdKeyRefused(f"etcd key {name} holds the handoff of model {doc.model!r}, not {model!r}")
    return doc
