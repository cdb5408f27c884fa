"""The lease-backend seam: what the HA service and the standby need of a lease, and the two backends.

``ControlLease`` is the async face of a lease (claim / renew / release / peek plus the monotonic
``valid()``); the pure rules stay in ``router/ha/lease.py``.

- ``FileLease``: the file lease (``Lease`` + ``FileLeaseBackend``: ``flock`` + atomic rename), run
  off the event loop. The default for one host. A router that loses it stays fenced (peer rule).
- ``EtcdLease`` (``router/ha/etcd_lease.py``, implements the protocol itself): holder key on an
  etcd lease, epoch counter, fenced handoff. ``reclaims`` is True: a router that lost control because etcd was unreachable claims
  again (epoch + 1) once etcd answers and the holder key is free.

``SharedHandoff`` is where a successor finds the holder's handoff (the file beside the lease, or
``<prefix>handoff`` in etcd); ``write`` raises ``PersistError`` when the document is not stored.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Protocol

from router.clock import Clock
from router.ha import statefile
from router.ha.etcd_client import EtcdClient
from router.ha.etcd_lease import EtcdKeyRefused, EtcdLease, FencedWriteFailed
from router.ha.handoff import Handoff, HandoffError
from router.ha.lease import Lease, LeaseError, LeaseRecord, LeaseSettings
from router.ha.settings import HARuntime


class PersistError(RuntimeError):
    """The state could not be made durable where a successor reads it; the message says why."""


class ControlLease(Protocol):
    @property
    def holder(self) -> str: ...

    @property
    def epoch(self) -> int: ...

    @property
    def owned(self) -> bool: ...

    @property
    def reclaims(self) -> bool: ...

    def describe(self) -> str: ...

    def valid(self) -> bool: ...

    def remaining(self) -> float: ...

    async def claim(self) -> bool: ...

    async def renew(self) -> bool: ...

    async def release(self) -> None: ...

    async def peek(self) -> LeaseRecord | None: ...

    async def wait_vacant(self, timeout_s: float) -> None:
        """Return when the lease may be claimable (or after ``timeout_s``)."""
        ...


class FileLease:
    """The file lease behind the async seam (every call runs in a worker thread)."""

    reclaims = False

    def __init__(self, lease: Lease) -> None:
        self.lease = lease

    @property
    def settings(self) -> LeaseSettings:
        return self.lease.settings

    @property
    def holder(self) -> str:
        return self.lease.holder

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    @property
    def owned(self) -> bool:
        return self.lease.owned

    def describe(self) -> str:
        return str(self.lease.settings.path)

    def valid(self) -> bool:
        return self.lease.valid()

    def remaining(self) -> float:
        return self.lease.remaining()

    async def claim(self) -> bool:
        return await asyncio.to_thread(self.lease.claim)

    async def renew(self) -> bool:
        return await asyncio.to_thread(self.lease.renew)

    async def release(self) -> None:
        await asyncio.to_thread(self.lease.release)

    async def peek(self) -> LeaseRecord | None:
        return await asyncio.to_thread(self.lease.peek)

    async def wait_vacant(self, timeout_s: float) -> None:
        return None  # the caller's own cadence re-reads the file


class SharedHandoff(Protocol):
    def describe(self) -> str: ...

    async def write(self, doc: Handoff) -> None: ...

    async def read(self) -> Handoff | None:
        """The stored document (None: none); ``HandoffError`` / ``LeaseError`` when unusable."""
        ...


class FileSharedHandoff:
    """``<lease_path>.handoff.json`` beside the lease file."""

    def __init__(self, lease_path: str) -> None:
        self.path: Path = statefile.shared_handoff_path(lease_path)

    def describe(self) -> str:
        return str(self.path)

    async def write(self, doc: Handoff) -> None:
        try:
            await asyncio.to_thread(statefile.write, self.path, doc)
        except (OSError, ValueError) as exc:
            raise PersistError(f"shared handoff {self.path} not written: {exc}") from None

    async def read(self) -> Handoff | None:
        return await asyncio.to_thread(statefile.load, self.path)


class EtcdSharedHandoff:
    """``<prefix>handoff``: every write a txn fenced by our holder key's create revision."""

    def __init__(self, lease: EtcdLease) -> None:
        self.lease = lease

    def describe(self) -> str:
        return f"etcd {self.lease.handoff_key.decode()}"

    async def write(self, doc: Handoff) -> None:
        try:
            await self.lease.write_handoff(doc)
        except (FencedWriteFailed, EtcdKeyRefused) as exc:
            raise PersistError(f"fenced handoff write to {self.describe()} did not commit: {exc}") from None

    async def read(self) -> Handoff | None:
        doc, _ = await self.lease.read_handoff()
        return doc


def build_backend(
    settings: HARuntime, clock: Clock
) -> tuple[ControlLease | None, SharedHandoff | None, EtcdClient | None]:
    """The configured lease, its shared handoff and (etcd) the client to close at shutdown."""
    etcd = settings.etcd_settings()
    if etcd is not None:
        client = EtcdClient(settings.etcd_endpoints, timeout_s=etcd_timeout(settings))
        lease = EtcdLease(etcd, client, clock=clock)
        return lease, EtcdSharedHandoff(lease), client
    file_settings = settings.lease_settings()
    if file_settings is None:
        return None, None, None
    return FileLease(Lease(file_settings, clock=clock)), FileSharedHandoff(settings.lease_path), None


def etcd_timeout(settings: HARuntime) -> float:
    """Per-request timeout: a few tries fit in one renewal interval, never above the margin budget."""
    return max(0.2, min(1.0, settings.lease_renew_interval_s))


__all__ = [
    "ControlLease",
    "EtcdSharedHandoff",
    "FileLease",
    "FileSharedHandoff",
    "HandoffError",
    "LeaseError",
    "PersistError",
    "SharedHandoff",
    "build_backend",
]
