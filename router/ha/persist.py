"""Acknowledged means durable: the seam every lifecycle answer waits on.

A lifecycle mutation answers 200 only after ``Persister.persist`` returned: the holder's handoff
is then where a successor finds it. Two places, in this order:

1. the **shared** handoff (``HandoffStore``): with the file lease, ``<lease_path>.handoff.json``
   beside the lease (``FileHandoffStore``); another lease backend (etcd) provides its own store
   with a fenced write. This write decides the answer: it failing raises ``PersistError``.
2. the router's own **local** state file (``recovery.state_path``, what ``--resume`` reads). Without
   a lease it is the only place, so it decides the answer; with a lease its failure is counted and
   reported (control degraded) but the state is already durable in the shared store.

Every blocking write runs in a worker thread (``asyncio.to_thread``): fsync never stalls serving.
Writes are serialised by one lock and each builds its document inside it, so an older snapshot
never lands after a newer one.

The periodic write (``persist(periodic=True)``: the monitor's ``handoff`` stage, every
``controller.monitor_interval_s``) is skipped while the document says what the last written one
said — the same lifecycle records, roles, ejections, process starts, demand evidence, epoch and
holder — unless ``REFRESH_S`` passed since that write or the last write failed. What rides along
is the snapshot time ``at`` and the serving counters (``counters``, ``outcome_reasons``): they are
written at least every ``REFRESH_S``, and at once with any other change. Nothing acknowledged
depends on it (every mutation writes before it answers, periodic or not), the durable copy is
used by a takeover however old it is (``standby.takeover_handoff``), and a write that fails is
retried every pass until one succeeds (so recovery is seen at once). What it saves is an idle or
steadily serving router's fsync pair every second (≈1 ms of CPU per second, docs/benchmarks.md
§10); what it costs is up to ``REFRESH_S`` of counter increments after a kill -9 and ``--resume``
(a SIGTERM writes a final snapshot, and a standby's takeover uses its fresher poll).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

from router.ha import statefile
from router.ha.handoff import Handoff, HandoffError

log = logging.getLogger("narwhal.ha.persist")
REFRESH_S = 5.0  # a periodic write with only ``at`` and the counters changed waits at most this long
_RIDES_ALONG = {"at": 0.0, "counters": {}, "outcome_reasons": {}}


def same_state(a: Handoff, b: Handoff) -> bool:
    """The two snapshots say the same apart from what rides along (``at`` and the counters)."""
    return a.model_copy(update=_RIDES_ALONG) == b.model_copy(update=_RIDES_ALONG)


class PersistError(RuntimeError):
    """The state could not be made durable where a successor reads it; the message says why."""


@runtime_checkable
class HandoffStore(Protocol):
    """The shared copy of the holder's handoff (what a standby or a resuming router reads)."""

    def describe(self) -> str:
        """Where the document lives, for messages (``/ready``, logs)."""
        ...

    async def write(self, doc: Handoff) -> None:
        """Durably store ``doc`` (fenced to the writer's lease where the backend can); raises
        ``PersistError`` (or ``OSError``) when it is not stored."""
        ...

    async def read(self) -> statefile.StateRead:
        """The stored document, or why there is none (never raises for a bad document)."""
        ...


class FileHandoffStore:
    """``<lease_path>.handoff.json``: atomic no-follow write + fsync of file and directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def describe(self) -> str:
        return str(self.path)

    async def write(self, doc: Handoff) -> None:
        await asyncio.to_thread(statefile.write, self.path, doc)

    async def read(self) -> statefile.StateRead:
        return await asyncio.to_thread(statefile.read, self.path)


class LeaseValidity(Protocol):
    def valid(self) -> bool: ...


async def read_after_claim(
    store: HandoffStore, lease: LeaseValidity, note: Callable[[str], None], retry_s: float
) -> statefile.StateRead | None:
    """The shared handoff as read *after* a claim (nobody else can write it any more), read again
    while it is unreadable (EACCES, EMFILE, etcd unreachable), never skipped: an unreadable copy
    may hold a change another controller acknowledged. Backoff from ``retry_s`` doubling up to
    ``4 × retry_s``, for as long as the fresh lease is locally valid (the injected clock); None
    when it ran out first (the caller releases it and claims again later). ``note`` gets the
    reason while it cannot read (``/ready``: the router is not controlling meanwhile)."""
    delay = retry_s
    while True:
        try:
            found = await store.read()
        except OSError as exc:
            found = statefile.StateRead(None, "unreadable", f"{store.describe()}: {describe_error(exc)}")
        except HandoffError as exc:  # (a document of an incompatible version)
            found = statefile.StateRead(None, "invalid", f"handoff invalid: {exc}")
        if found.kind != "unreadable":
            return found
        if not lease.valid():
            return None
        why = f"handoff unreadable after the claim, reading it again: {found.reason}"
        log.warning("%s", why)
        note(why)
        await asyncio.sleep(delay)
        delay = min(2 * delay, 4 * retry_s)
        if not lease.valid():
            return None


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f" {exc.filename}" if exc.filename else ""
        return f"[Errno {exc.errno}] {exc.strerror}{where}"
    return f"{type(exc).__name__}: {exc}"


class Persister:
    """Writes the live handoff (shared store first, then the local state file) and keeps the
    control plane's persistence verdict: ``degraded`` is "" or why the last write failed."""

    def __init__(
        self,
        build: Callable[[], Handoff],
        state_path: str | Path,
        shared: HandoffStore | None,
        on_change: Callable[[str], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.build = build
        self.monotonic = monotonic
        self.written: Handoff | None = None  # the last document written in full, and when
        self.written_at = float("-inf")
        self.skipped = 0  # periodic writes skipped (nothing but ``at`` and the counters changed)
        self.state_path = Path(state_path)
        self.shared = shared
        self.on_change = on_change  # called with the new degraded reason ("" = recovered)
        self.failures = 0
        self.degraded = ""
        self.lock = asyncio.Lock()

    def _set(self, reason: str) -> None:
        if reason == self.degraded:
            return
        if reason:
            log.error("control plane degraded: %s", reason)
        else:
            log.info("state persisted again (was: %s)", self.degraded)
        self.degraded = reason
        if self.on_change is not None:
            self.on_change(reason)

    async def persist(self, periodic: bool = False) -> Handoff:
        """Make the current state durable; raises ``PersistError`` naming where and why not.

        ``periodic``: the monitor's write, skipped when only ``at`` and the counters changed since
        the last successful write less than ``REFRESH_S`` ago (the module's docstring)."""
        async with self.lock:
            return await self._persist_locked(periodic)

    async def _persist_locked(self, periodic: bool) -> Handoff:
        try:
            doc = self.build()
        except ValueError as exc:  # our own state fails validation: nothing can be written
            self.failures += 1
            reason = f"state not persisted: handoff invalid: {exc}"
            self._set(reason)
            raise PersistError(reason) from None
        last = self.written
        if (
            periodic
            and last is not None
            and not self.degraded
            and self.monotonic() - self.written_at < REFRESH_S
            and same_state(doc, last)
        ):
            self.skipped += 1
            return last
        self.written = None  # until this write has landed in full
        if self.shared is not None:
            try:
                await self.shared.write(doc)
            except (OSError, PersistError) as exc:
                self.failures += 1
                reason = (
                    f"state not persisted: shared handoff {self.shared.describe()}: {describe_error(exc)}"
                )
                self._set(reason)
                raise PersistError(reason) from None
        try:
            await asyncio.to_thread(statefile.write, self.state_path, doc)
        except OSError as exc:
            self.failures += 1
            reason = f"state file {self.state_path} not written: {describe_error(exc)}"
            self._set(reason if self.shared is not None else f"state not persisted: {reason}")
            if self.shared is None:
                raise PersistError(self.degraded) from None
            log.warning("%s (the shared handoff holds the state)", reason)
            return doc
        self._set("")
        self.written, self.written_at = doc, self.monotonic()
        return doc
