"""Router lease (`narwhal.router-lease` v1, spec §3.1–3.3): pure rules, a backend seam, a file backend.

The lease decides which router controls the fleet. The persisted record carries wall-clock times
(both routers compare ``expires_at`` with their own wall clock, so their offset must stay below the
safety margin); *local* validity is a deadline on the holder's monotonic clock
(``monotonic + ttl − margin``), so a wall-clock step never extends it.

Layers:

- ``LeaseRecord`` (pydantic) / ``parse_record`` / ``encode_record``: the document, strict (fail closed).
- ``claim_rule`` / ``renew_rule`` / ``release_rule``: pure decisions from (record, holder, now).
- ``LeaseBackend``: read-modify-write under a lock; ``FileLeaseBackend`` uses ``flock`` on
  ``<path>.lock`` and writes through a temp file + ``os.replace``.
- ``Lease``: ownership and the monotonic deadline of one process's holder token.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from router.clock import Clock, SystemClock
from router.config import check_lease_timing
from router.ha import statefile

log = logging.getLogger("narwhal.ha.lease")

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
SCHEMA: Final = "narwhal.router-lease"
SCHEMA_VERSION: Final = 1


class LeaseError(RuntimeError):
    """The lease store cannot be read or written, or holds a malformed record (fail closed)."""


class LeaseCorrupt(LeaseError):
    """The lease record exists but is not a valid ``narwhal.router-lease`` v1 document."""


@dataclass(frozen=True, slots=True)
class Unreadable:
    """What ``LeaseBackend.update`` passes for a record that exists but does not parse."""

    problem: str


# -- the document ---------------------------------------------------------------------------


class LeaseRecord(BaseModel):
    """The persisted ``narwhal.router-lease`` v1 record. Strict: a wrong type, a missing or unknown
    key, a non-finite time or another schema raises (``record_from_doc`` turns that into
    ``LeaseError``: fail closed)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    epoch: int = Field(ge=1)
    holder: str = Field(min_length=1)
    expires_at: float
    updated_at: float
    schema_: Literal["narwhal.router-lease"] = Field(alias="schema")
    schema_version: int

    @field_validator("schema_version")
    @classmethod
    def _v1(cls, v: int) -> int:
        if v != SCHEMA_VERSION:
            raise ValueError(f"schema_version {v} is not {SCHEMA_VERSION}")
        return v

    @classmethod
    def of(cls, epoch: int, holder: str, expires_at: float, updated_at: float) -> LeaseRecord:
        """A validated v1 record (the rules build records with this)."""
        return cls(
            epoch=epoch,
            holder=holder,
            expires_at=expires_at,
            updated_at=updated_at,
            schema=SCHEMA,
            schema_version=SCHEMA_VERSION,
        )

    def to_doc(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True)


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'record'}: {err['msg']}" for err in exc.errors()
    )


def record_from_doc(doc: Any) -> LeaseRecord:
    """Validate a decoded lease document; anything unexpected raises ``LeaseError``."""
    if not isinstance(doc, dict):
        raise LeaseError("lease record must be a JSON object")
    try:
        return LeaseRecord.model_validate(doc)
    except ValidationError as exc:
        raise LeaseError(f"lease record invalid: {_problems(exc)}") from None


def parse_record(raw: bytes) -> LeaseRecord:
    """Decode a lease record; ``LeaseCorrupt`` for anything that is not a valid one."""
    if not raw.strip():
        raise LeaseCorrupt("lease record is empty")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise LeaseCorrupt(f"lease record is not valid JSON: {exc}") from None
    try:
        return record_from_doc(doc)
    except LeaseCorrupt:
        raise
    except LeaseError as exc:
        raise LeaseCorrupt(str(exc)) from None


def encode_record(record: LeaseRecord) -> bytes:
    for name, v in (("expires_at", record.expires_at), ("updated_at", record.updated_at)):
        if not math.isfinite(v):  # a model_construct'ed record skipped validation
            raise LeaseError(f"refusing to write a lease record with non-finite {name}")
    return (json.dumps(record.to_doc(), sort_keys=True, allow_nan=False) + "\n").encode()


# -- pure rules (spec §3.1) ---------------------------------------------------------------------


def claim_rule(
    current: LeaseRecord | Unreadable | None,
    holder: str,
    now: float,
    ttl: float,
    floor: int = 0,
    wait_until: float = 0.0,
) -> LeaseRecord | None:
    """The record a claim writes, or None when another holder's unexpired lease stands.

    Epochs never go backwards: a new claim takes an epoch above both the record's and ``floor``
    (the highest epoch the claimer saw anywhere: handoff documents, earlier records). A record that
    is unreadable or vanished may still belong to a live holder: it is claimable only from
    ``wait_until`` on (the last expiry the claimer saw, or a full TTL after it first saw the damage).
    """
    if isinstance(current, Unreadable) or current is None:
        if now < wait_until:
            return None
        return LeaseRecord.of(floor + 1, holder, now + ttl, now)
    if current.expires_at > now:
        if current.holder != holder:
            return None
        return LeaseRecord.of(current.epoch, holder, now + ttl, now)
    return LeaseRecord.of(max(current.epoch, floor) + 1, holder, now + ttl, now)


def renew_rule(
    current: LeaseRecord | Unreadable | None, holder: str, epoch: int, now: float, ttl: float
) -> LeaseRecord | None:
    """The renewed record, or None when the lease is lost (other holder/epoch, expired).

    An unreadable or vanished record is rewritten by the holder (which holds the lock and knows its
    epoch); the caller only renews while its own lease is locally valid.
    """
    if isinstance(current, Unreadable) or current is None:
        return LeaseRecord.of(epoch, holder, now + ttl, now)
    if current.holder != holder or current.epoch != epoch or current.expires_at <= now:
        return None
    return LeaseRecord.of(epoch, holder, now + ttl, now)


def release_rule(
    current: LeaseRecord | Unreadable | None, holder: str, epoch: int, now: float
) -> LeaseRecord | None:
    """The expired record a release writes, or None to leave a successor's record alone."""
    if not isinstance(current, LeaseRecord) or current.holder != holder or current.epoch != epoch:
        return None
    return LeaseRecord.of(epoch, holder, now, now)


def renewed_since(first: LeaseRecord, current: LeaseRecord | Unreadable | None) -> bool:
    """A record found held at start (``first``) has since been renewed or taken by someone: its
    holder (or a successor) is alive. A record left as it was, released (expiry moved back),
    damaged or gone is not: its holder may be gone, so the starter waits for it to expire."""
    if not isinstance(current, LeaseRecord):
        return False
    if current.holder != first.holder or current.epoch != first.epoch:
        return True
    return current.expires_at > first.expires_at


# -- settings ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    path: str
    router_id: str
    ttl_s: float = 5.0
    renew_interval_s: float = 1.0
    safety_margin_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("lease path must not be empty")
        if not self.router_id:
            raise ValueError("router id must not be empty")
        check_lease_timing(self.ttl_s, self.renew_interval_s, self.safety_margin_s)


# -- backends -----------------------------------------------------------------------------------

Update = Callable[[LeaseRecord | Unreadable | None], LeaseRecord | None]


class LeaseBackend(Protocol):
    def read(self) -> LeaseRecord | None:
        """The current record (None: no record); ``LeaseCorrupt`` for a malformed one,
        ``LeaseError`` on I/O errors."""
        ...

    def update(self, fn: Update) -> LeaseRecord | None:
        """Under the lock: read, ``fn(current)``, write the result unless None. Returns what was
        written. A malformed record is passed as ``Unreadable`` (so it can be recovered); I/O
        errors raise ``LeaseError``."""
        ...

    def read_floor(self) -> int:
        """The highest epoch ever written to this store (kept apart from the record, so deleting
        the record does not reset it); 0 when there is none. Read by ``fn`` under the lock."""
        ...


class FileLeaseBackend:
    """JSON lease file; ``flock(LOCK_EX)`` on ``<path>.lock`` around every read-modify-write."""

    def __init__(self, path: str | Path, lock_timeout_s: float = 1.0) -> None:
        self.path = Path(path)
        self.lock_path = Path(str(self.path) + ".lock")
        # the epoch floor: the highest epoch ever claimed here, written (fsync'd) before the record
        # of every claim that raises it, so deleting the record (and the shared handoff) does not
        # let the next claim reuse an epoch
        self.floor_path = Path(str(self.path) + ".epoch")
        self._floor = -1  # the floor as read in the current update (-1: not yet)
        # Bounded: a peer stopped (SIGSTOP) inside its critical section must not wedge us.
        self.lock_timeout_s = lock_timeout_s

    def read(self) -> LeaseRecord | None:
        try:
            fd = os.open(self.path, os.O_RDONLY | _NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise LeaseCorrupt(f"lease record {self.path} is a symbolic link (not followed)") from None
            raise LeaseError(f"cannot read lease {self.path}: {exc.strerror or exc}") from None
        try:
            with os.fdopen(fd, "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            raise LeaseError(f"cannot read lease {self.path}: {exc.strerror or exc}") from None
        return parse_record(raw)

    def _current(self) -> LeaseRecord | Unreadable | None:
        try:
            return self.read()
        except LeaseCorrupt as exc:
            return Unreadable(str(exc))

    def update(self, fn: Update) -> LeaseRecord | None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise LeaseError(f"cannot open lease lock {self.lock_path}: {exc.strerror or exc}") from None
        try:
            self._lock(lock_fd)
            try:
                self._floor = -1  # read at most once per update (``read_floor``)
                new = fn(self._current())
                if new is not None:
                    if new.epoch > self.read_floor():
                        self._write_floor(new.epoch)
                    self._write(new)
                return new
            finally:
                with contextlib.suppress(OSError):
                    fcntl.flock(lock_fd, fcntl.LOCK_UN)
        finally:
            os.close(lock_fd)

    def read_floor(self) -> int:
        if self._floor >= 0:
            return self._floor
        raw, kind, detail = statefile.read_raw(self.floor_path)
        floor = 0
        if raw is not None:
            text = raw.decode("ascii", errors="replace").strip()
            if text.isdigit():
                floor = int(text)
            else:  # torn or foreign: the record and the handoffs still count; rewritten at the next claim
                log.warning("lease epoch floor %s unreadable (%r): ignored", self.floor_path, text[:40])
        elif kind != "missing":
            log.warning("lease epoch floor unreadable: %s", detail)
        self._floor = floor
        return floor

    def _write_floor(self, epoch: int) -> None:
        try:
            statefile.write_bytes(self.floor_path, f"{epoch}\n".encode())
            self._floor = epoch
        except OSError as exc:  # (a full disk must not cost a claim: the record carries the epoch)
            log.warning("cannot write lease epoch floor %s: %s", self.floor_path, exc)

    def _lock(self, fd: int) -> None:
        give_up = time.monotonic() + self.lock_timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= give_up:
                    raise LeaseError(f"lease lock {self.lock_path} busy for {self.lock_timeout_s}s") from None
                time.sleep(0.005)
            except OSError as exc:
                raise LeaseError(f"cannot lock {self.lock_path}: {exc.strerror or exc}") from None

    def _write(self, record: LeaseRecord) -> None:
        data = encode_record(record)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | os.O_CLOEXEC, 0o644)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
            os.replace(tmp, self.path)  # replaces a planted symlink itself, never its target
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT) and self._write_in_place(data):
                return  # a full disk must not cost the lease: serving goes on
            raise LeaseError(f"cannot write lease {self.path}: {exc.strerror or exc}") from None
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()

    def _write_in_place(self, data: bytes) -> bool:
        """On a full disk: overwrite the existing record in its own blocks (no new space needed).

        Not atomic, but under the lock; a reader that sees a torn record treats it as damaged (the
        holder rewrites it, others wait it out), so the worst case is a missed standby probe."""
        try:
            fd = os.open(self.path, os.O_WRONLY | _NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            if os.fstat(fd).st_size < len(data) and os.fstat(fd).st_blocks * 512 < len(data):
                return False  # would need a new block: nothing gained
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
            return True
        except OSError:
            return False
        finally:
            os.close(fd)


# -- one process's lease ----------------------------------------------------------------------------


def new_holder(router_id: str) -> str:
    """``<router-id>:<uuid4hex>``: unique per process, so a restart never re-owns an old epoch."""
    if not router_id:
        raise ValueError("router id must not be empty")
    return f"{router_id}:{uuid.uuid4().hex}"


class Lease:
    """Claim / renew / release one holder token; ``valid()`` uses the monotonic deadline only.

    It remembers what it saw of the shared record: the highest epoch (claims go above it), the
    latest expiry of another holder's record (a record that then turns unreadable or vanishes is
    claimable only after it), and ``problem``: the last damage found in the record ("" = none).
    """

    def __init__(
        self,
        settings: LeaseSettings,
        backend: LeaseBackend | None = None,
        clock: Clock | None = None,
        holder: str | None = None,
    ) -> None:
        self.settings = settings  # validated before any file is touched
        self.holder = holder if holder is not None else new_holder(settings.router_id)
        if not self.holder:
            raise ValueError("lease holder must not be empty")
        self.backend: LeaseBackend = backend if backend is not None else FileLeaseBackend(settings.path)
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.owned = False
        self.epoch = 0
        self.deadline = 0.0  # monotonic
        self.previous_epoch = 0  # the record's epoch when we claimed (0: none / unreadable)
        self.max_epoch_seen = 0
        self.other_expiry_seen = 0.0  # wall: latest expires_at of another holder's record
        self.damaged_since: float | None = None  # wall: first sighting of the current damage
        self.problem = ""  # the record's damage, as last seen ("" = a valid record or none)
        self.recovered = ""  # what the last recovery did (kept for /ready and the log)

    def _local_deadline(self, mono_before: float) -> float:
        return mono_before + self.settings.ttl_s - self.settings.safety_margin_s

    def valid(self) -> bool:
        return self.owned and self.clock.monotonic() < self.deadline

    def remaining(self) -> float:
        return max(0.0, self.deadline - self.clock.monotonic()) if self.owned else 0.0

    def observe(self, current: LeaseRecord | Unreadable | None, now: float) -> None:
        """Remember a sighting of the shared record (epochs, another holder's expiry, damage)."""
        if isinstance(current, LeaseRecord):
            self.max_epoch_seen = max(self.max_epoch_seen, current.epoch)
            if current.holder != self.holder:
                self.other_expiry_seen = max(self.other_expiry_seen, current.expires_at)
            self.damaged_since, self.problem = None, ""
        elif isinstance(current, Unreadable):
            if self.damaged_since is None:
                self.damaged_since = now
            self.problem = current.problem

    def claim(self, floor: int = 0) -> bool:
        """True when this holder now owns the lease; False when another holder's lease stands (or a
        damaged record may still be a live holder's). ``floor``: the highest epoch seen elsewhere."""
        mono = self.clock.monotonic()
        now = self.clock.wall()
        ttl = self.settings.ttl_s
        seen: dict[str, LeaseRecord | Unreadable | None] = {}

        def fn(cur: LeaseRecord | Unreadable | None) -> LeaseRecord | None:
            seen["cur"] = cur
            self.observe(cur, now)
            top = max(floor, self.max_epoch_seen, self.backend.read_floor())
            wait = self.other_expiry_seen
            if isinstance(cur, Unreadable) and self.damaged_since is not None:
                wait = max(wait, self.damaged_since + ttl)
            return claim_rule(cur, self.holder, now, ttl, floor=top, wait_until=wait)

        try:
            written = self.backend.update(fn)
        except LeaseError as exc:
            self.owned = False
            raise LeaseError(f"cannot claim lease: {exc}") from None
        if written is None:
            self.owned = False
            return False
        cur = seen.get("cur")
        self.previous_epoch = cur.epoch if isinstance(cur, LeaseRecord) else 0
        if isinstance(cur, Unreadable):
            self.recovered = f"{cur.problem}: claimed epoch {written.epoch} above every epoch seen"
        elif cur is None and self.max_epoch_seen:
            self.recovered = f"lease record missing: claimed epoch {written.epoch} above every epoch seen"
        self.max_epoch_seen = max(self.max_epoch_seen, written.epoch)
        self.owned, self.epoch, self.deadline = True, written.epoch, self._local_deadline(mono)
        self.damaged_since, self.problem = None, ""
        return True

    def renew(self) -> bool:
        """Extend the lease. False when it is lost (ownership cleared); ``LeaseError`` when the
        store could not be reached (a local, possibly transient error: ownership kept, local
        deadline not extended, the caller retries while ``valid()``)."""
        if not self.owned:
            return False
        mono = self.clock.monotonic()
        now = self.clock.wall()
        epoch = self.epoch
        seen: dict[str, LeaseRecord | Unreadable | None] = {}

        def fn(cur: LeaseRecord | Unreadable | None) -> LeaseRecord | None:
            seen["cur"] = cur
            if not isinstance(cur, LeaseRecord) and not self.valid():
                return None  # only a holder still inside its validity may rewrite a damaged record
            return renew_rule(cur, self.holder, epoch, now, self.settings.ttl_s)

        written = self.backend.update(fn)
        if written is None:
            self.owned = False
            return False
        cur = seen.get("cur")
        if not isinstance(cur, LeaseRecord):
            what = cur.problem if isinstance(cur, Unreadable) else "lease record missing"
            self.recovered = f"{what}: rewritten by the holder at epoch {epoch}"
        self.deadline = self._local_deadline(mono)
        return True

    def release(self) -> None:
        """Expire our own record now (epoch kept); never disturbs a successor's record."""
        if not self.owned:
            return
        self.owned = False
        now = self.clock.wall()
        epoch = self.epoch
        with contextlib.suppress(LeaseError):
            self.backend.update(lambda cur: release_rule(cur, self.holder, epoch, now))

    def peek(self) -> LeaseRecord | None:
        """The shared record as it is now (``LeaseError`` when unreadable, ``LeaseCorrupt`` when damaged)."""
        now = self.clock.wall()
        try:
            record = self.backend.read()
        except LeaseCorrupt as exc:
            self.observe(Unreadable(str(exc)), now)
            raise
        self.observe(record, now)
        return record
