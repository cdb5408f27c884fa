"""The lease-backend seam: what the HA service, the keeper and the standby need of a lease.

``ControlLease`` is the async face of a lease (claim / renew / release / peek, plus the monotonic
``valid()`` and what the keeper reads: ``problem``, ``recovered``, ``previous_epoch``, ``contends``); the pure
rules stay in ``router/ha/lease.py``. ``renew`` returns False on a *real* loss and raises
``LeaseError`` when the store could not be reached (retried within local validity).

- ``FileLease``: the file lease (``Lease`` + ``FileLeaseBackend``: ``flock`` + atomic rename), run
  off the event loop. The default for one host.
- ``EtcdLease`` (``router/ha/etcd_lease.py``, implements the protocol itself): holder key on an
  etcd lease, epoch counter, fenced handoff; ``EtcdHandoffStore`` is its ``HandoffStore``.

``build_backend`` picks one from the settings (``--lease-path`` or ``--etcd-endpoints``).
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from router.clock import Clock
from router.ha import statefile
from router.ha.etcd_client import EtcdClient
from router.ha.etcd_lease import EtcdKeyRefused, EtcdLease, FencedWriteFailed
from router.ha.handoff import Handoff
from router.ha.lease import Lease, LeaseError, LeaseRecord, LeaseSettings
from router.ha.persist import FileHandoffStore, HandoffStore, PersistError
from router.ha.settings import HARuntime


class ControlLease(Protocol):
    owned: bool

    @property
    def contends(self) -> bool:
        """True (etcd): a router that lost the lease, or found it held, keeps contending for it
        (``wait_vacant``); False (file lease): fenced for good, the peer rule."""
        ...

    @property
    def holder(self) -> str: ...

    @property
    def epoch(self) -> int: ...

    @property
    def previous_epoch(self) -> int: ...

    @property
    def problem(self) -> str: ...

    @property
    def recovered(self) -> str: ...

    def describe(self) -> str: ...

    def valid(self) -> bool: ...

    def remaining(self) -> float: ...

    async def claim(self, floor: int = 0) -> bool: ...

    async def renew(self) -> bool: ...

    async def release(self) -> None: ...

    async def peek(self) -> LeaseRecord | None: ...

    async def wait_vacant(self, timeout_s: float) -> None:
        """Return when the lease may have become claimable (etcd: a watch), or after ``timeout_s``."""
        ...


class FileLease:
    """The file lease behind the async seam (every store access runs in a worker thread)."""

    contends = False  # the peer rule: a live holder fences this router for good

    def __init__(self, lease: Lease) -> None:
        self.lease = lease

    @property
    def settings(self) -> LeaseSettings:
        return self.lease.settings

    @property
    def owned(self) -> bool:
        return self.lease.owned

    @owned.setter
    def owned(self, value: bool) -> None:
        self.lease.owned = value

    @property
    def holder(self) -> str:
        return self.lease.holder

    @property
    def epoch(self) -> int:
        return self.lease.epoch

    @property
    def previous_epoch(self) -> int:
        return self.lease.previous_epoch

    @property
    def problem(self) -> str:
        return self.lease.problem

    @property
    def recovered(self) -> str:
        return self.lease.recovered

    def describe(self) -> str:
        return str(self.lease.settings.path)

    def valid(self) -> bool:
        return self.lease.valid()

    def remaining(self) -> float:
        return self.lease.remaining()

    async def claim(self, floor: int = 0) -> bool:
        return await asyncio.to_thread(self.lease.claim, floor)

    async def renew(self) -> bool:
        return await asyncio.to_thread(self.lease.renew)

    async def release(self) -> None:
        await asyncio.to_thread(self.lease.release)

    async def peek(self) -> LeaseRecord | None:
        return await asyncio.to_thread(self.lease.peek)

    async def wait_vacant(self, timeout_s: float) -> None:
        return None  # the caller's own cadence re-reads the file


def as_control_lease(lease: ControlLease | Lease) -> ControlLease:
    return FileLease(lease) if isinstance(lease, Lease) else lease


class EtcdHandoffStore:
    """``<prefix>handoff``: every write a txn fenced by our holder key's create revision."""

    def __init__(self, lease: EtcdLease) -> None:
        self.lease = lease

    def describe(self) -> str:
        return f"etcd {self.lease.handoff_key.decode()}"

    async def write(self, doc: Handoff) -> None:
        try:
            await self.lease.write_handoff(doc)
        except (FencedWriteFailed, EtcdKeyRefused) as exc:
            raise PersistError(f"fenced write did not commit: {exc}") from None

    async def read(self) -> statefile.StateRead:
        try:
            doc, _ = await self.lease.read_handoff()
        except EtcdKeyRefused as exc:
            return statefile.StateRead(None, "invalid", str(exc))
        except LeaseError as exc:
            return statefile.StateRead(None, "unreadable", str(exc))
        if doc is None:
            return statefile.StateRead(None, "missing", f"no handoff at {self.describe()}")
        return statefile.StateRead(doc, "ok", "")


def build_backend(
    settings: HARuntime, clock: Clock
) -> tuple[ControlLease | None, HandoffStore | None, EtcdClient | None]:
    """The configured lease, its shared handoff store and (etcd) the client to close at shutdown."""
    etcd = settings.etcd_settings()
    if etcd is not None:
        client = EtcdClient(
            settings.etcd_endpoints, timeout_s=etcd_timeout(settings), security=settings.etcd_security()
        )
        lease = EtcdLease(etcd, client, clock=clock)
        return lease, EtcdHandoffStore(lease), client
    file_settings = settings.lease_settings()
    if file_settings is None:
        return None, None, None
    shared = FileHandoffStore(statefile.shared_handoff_path(settings.lease_path))
    return FileLease(Lease(file_settings, clock=clock)), shared, None


def etcd_timeout(settings: HARuntime) -> float:
    """Per-request timeout: a few tries fit in one renewal interval."""
    return max(0.2, min(1.0, settings.lease_renew_interval_s))
