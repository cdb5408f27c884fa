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
import fcntl
import json
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

SCHEMA: Final = "narwhal.router-lease"
SCHEMA_VERSION: Final = 1


class LeaseError(RuntimeError):
    """The lease store cannot be read or written, or holds a malformed record (fail closed)."""


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
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise LeaseError(f"lease record is not valid JSON: {exc}") from None
    return record_from_doc(doc)


def encode_record(record: LeaseRecord) -> bytes:
    for name, v in (("expires_at", record.expires_at), ("updated_at", record.updated_at)):
        if not math.isfinite(v):  # a model_construct'ed record skipped validation
            raise LeaseError(f"refusing to write a lease record with non-finite {name}")
    return (json.dumps(record.to_doc(), sort_keys=True, allow_nan=False) + "\n").encode()


# -- pure rules (spec §3.1) ---------------------------------------------------------------------


def claim_rule(current: LeaseRecord | None, holder: str, now: float, ttl: float) -> LeaseRecord | None:
    """The record a claim writes, or None when another holder's unexpired lease stands."""
    if current is not None and current.expires_at > now:
        if current.holder != holder:
            return None
        return LeaseRecord.of(current.epoch, holder, now + ttl, now)
    epoch = current.epoch + 1 if current is not None else 1
    return LeaseRecord.of(epoch, holder, now + ttl, now)


def renew_rule(
    current: LeaseRecord | None, holder: str, epoch: int, now: float, ttl: float
) -> LeaseRecord | None:
    """The renewed record, or None when the lease is lost (vanished, other holder/epoch, expired)."""
    if current is None or current.holder != holder or current.epoch != epoch or current.expires_at <= now:
        return None
    return LeaseRecord.of(epoch, holder, now + ttl, now)


def release_rule(current: LeaseRecord | None, holder: str, epoch: int, now: float) -> LeaseRecord | None:
    """The expired record a release writes, or None to leave a successor's record alone."""
    if current is None or current.holder != holder or current.epoch != epoch:
        return None
    return LeaseRecord.of(epoch, holder, now, now)


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

Update = Callable[[LeaseRecord | None], LeaseRecord | None]


class LeaseBackend(Protocol):
    def read(self) -> LeaseRecord | None:
        """The current record (None: no lease file); ``LeaseError`` on I/O or malformed data."""
        ...

    def update(self, fn: Update) -> LeaseRecord | None:
        """Under the lock: read, ``fn(current)``, write the result unless None. Returns what was written."""
        ...


class FileLeaseBackend:
    """JSON lease file; ``flock(LOCK_EX)`` on ``<path>.lock`` around every read-modify-write."""

    def __init__(self, path: str | Path, lock_timeout_s: float = 1.0) -> None:
        self.path = Path(path)
        self.lock_path = Path(str(self.path) + ".lock")
        # Bounded: a peer stopped (SIGSTOP) inside its critical section must not wedge us.
        self.lock_timeout_s = lock_timeout_s

    def read(self) -> LeaseRecord | None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise LeaseError(f"cannot read lease {self.path}: {exc.strerror or exc}") from None
        return parse_record(raw)

    def update(self, fn: Update) -> LeaseRecord | None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = self.lock_path.open("a+")
        except OSError as exc:
            raise LeaseError(f"cannot open lease lock {self.lock_path}: {exc.strerror or exc}") from None
        with lock:
            self._lock(lock.fileno())
            try:
                new = fn(self.read())
                if new is not None:
                    self._write(new)
                return new
            finally:
                with contextlib.suppress(OSError):
                    fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

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
            with tmp.open("wb") as fh:
                fh.write(data)
                fh.flush()
            os.replace(tmp, self.path)
        except OSError as exc:
            raise LeaseError(f"cannot write lease {self.path}: {exc.strerror or exc}") from None
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()


# -- one process's lease ----------------------------------------------------------------------------


def new_holder(router_id: str) -> str:
    """``<router-id>:<uuid4hex>``: unique per process, so a restart never re-owns an old epoch."""
    if not router_id:
        raise ValueError("router id must not be empty")
    return f"{router_id}:{uuid.uuid4().hex}"


class Lease:
    """Claim / renew / release one holder token; ``valid()`` uses the monotonic deadline only."""

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

    def _local_deadline(self, mono_before: float) -> float:
        return mono_before + self.settings.ttl_s - self.settings.safety_margin_s

    def valid(self) -> bool:
        return self.owned and self.clock.monotonic() < self.deadline

    def remaining(self) -> float:
        return max(0.0, self.deadline - self.clock.monotonic()) if self.owned else 0.0

    def claim(self) -> bool:
        """True when this holder now owns the lease; False when another holder's lease stands."""
        mono = self.clock.monotonic()
        now = self.clock.wall()
        try:
            written = self.backend.update(lambda cur: claim_rule(cur, self.holder, now, self.settings.ttl_s))
        except LeaseError as exc:
            self.owned = False
            raise LeaseError(f"cannot claim lease: {exc}") from None
        if written is None:
            self.owned = False
            return False
        self.owned, self.epoch, self.deadline = True, written.epoch, self._local_deadline(mono)
        return True

    def renew(self) -> bool:
        """Extend the lease; False when it is lost (ownership cleared) or the write failed."""
        if not self.owned:
            return False
        mono = self.clock.monotonic()
        now = self.clock.wall()
        epoch = self.epoch
        try:
            written = self.backend.update(
                lambda cur: renew_rule(cur, self.holder, epoch, now, self.settings.ttl_s)
            )
        except LeaseError:
            return False  # local deadline not extended; the caller fences
        if written is None:
            self.owned = False
            return False
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
        """The shared record as it is now (``LeaseError`` when unreadable)."""
        return self.backend.read()
