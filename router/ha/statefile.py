"""The handoff state file (``recovery.state_path``, spec §2.3): atomic, no-follow write; honest load.

``write`` validates, writes a unique temp file in the same directory (``O_CREAT|O_EXCL|O_NOFOLLOW``),
fsyncs it, ``os.replace``s it onto the target, fsyncs the directory (so the rename survives a power
cut) and always removes the temp file. It refuses a target that is a symlink: nothing is ever
written through a link planted in the state directory. ``write_bytes`` does the same for raw bytes
(the ``.rejected`` evidence copy).

``read`` opens with ``O_NOFOLLOW`` and says what it found: ``missing``, ``symlink``, ``empty``,
``torn`` (not JSON: a partial write without the atomic rename), ``not_utf8``, ``unreadable``,
``invalid`` (parseable but fails validation) or ``ok``. ``load`` keeps the peer contract (None for
nothing usable, raises ``HandoffError`` for an invalid document); ``load_reason`` never raises.

These functions block (fsync): call them through ``asyncio.to_thread`` from the event loop.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from router.ha.handoff import Handoff, HandoffError, HandoffVersionError, validate

Kind = Literal["ok", "missing", "symlink", "empty", "torn", "not_utf8", "unreadable", "invalid", "not_file"]
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class SymlinkRefused(OSError):
    """A write or read target in the state directory is a symbolic link (never followed)."""

    def __init__(self, path: Path) -> None:
        super().__init__(errno.ELOOP, "refusing to follow a symbolic link", str(path))


def shared_handoff_path(lease_path: str) -> Path:
    """The lease holder's handoff beside the shared lease file (both routers see that directory).

    The holder writes it before answering any lifecycle change, so a takeover never misses a drain
    that was acknowledged after the standby's last poll.
    """
    return Path(lease_path + ".handoff.json")


def temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def refuse_symlink(path: Path) -> None:
    """Raise ``SymlinkRefused`` when ``path`` exists as a symbolic link."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise SymlinkRefused(path)


def write_bytes(path: str | Path, data: bytes) -> None:
    """Atomically replace ``path`` (never a symlink) with ``data``; OSError on any failure."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    refuse_symlink(target)
    tmp = temp_name(target)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        refuse_symlink(target)  # planted between the first check and the rename: still refused
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def encode(doc: Handoff) -> bytes:
    return (json.dumps(validate(doc).dump(), allow_nan=False) + "\n").encode()


def write(path: str | Path, doc: Handoff) -> None:
    """Atomically replace ``path`` with the validated document (OSError on I/O failure)."""
    write_bytes(path, encode(doc))


def read_raw(path: str | Path) -> tuple[bytes | None, Kind, str]:
    """The file's bytes without following a symlink: (data, "ok", "") or (None, kind, detail)."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
    except FileNotFoundError:
        return None, "missing", ""
    except OSError as exc:
        if exc.errno == errno.ELOOP or (os.path.islink(p)):
            return None, "symlink", f"{p} is a symbolic link (refused, not followed)"
        return None, "unreadable", f"{p}: {exc.strerror or exc}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "not_file", f"{p} is not a regular file"
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks), "ok", ""
    except OSError as exc:
        return None, "unreadable", f"{p}: {exc.strerror or exc}"
    finally:
        os.close(fd)


@dataclass(frozen=True)
class StateRead:
    """What a state file held: the document (kind ``ok``) or why there is none."""

    doc: Handoff | None
    kind: Kind
    reason: str  # "" for ok


def read(path: str | Path) -> StateRead:
    """Read and classify a state file; never raises (``HandoffVersionError`` aside, see ``load``)."""
    raw, kind, detail = read_raw(path)
    if raw is None:
        if kind == "missing":
            return StateRead(None, "missing", "no handoff file")
        return StateRead(None, kind, f"handoff file {kind.replace('_', ' ')}: {detail}")
    if not raw.strip():
        return StateRead(None, "empty", f"handoff file empty: {path} holds no document")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return StateRead(None, "not_utf8", f"handoff file not UTF-8: {path}")
    try:
        data = json.loads(text)
    except ValueError as exc:
        return StateRead(None, "torn", f"handoff file torn: {path} is not complete JSON ({exc})")
    try:
        return StateRead(validate(data), "ok", "")
    except HandoffVersionError:
        raise
    except HandoffError as exc:
        return StateRead(None, "invalid", f"handoff file invalid: {exc}")


def load(path: str | Path) -> Handoff | None:
    """The persisted document; None when there is nothing usable; raises when it is invalid."""
    result = read(path)
    if result.kind == "invalid":
        raise HandoffError(result.reason.removeprefix("handoff file invalid: "))
    return result.doc


def load_reason(path: str | Path) -> tuple[Handoff | None, str]:
    """``load`` that never raises: (document, "") or (None, why nothing can be applied)."""
    try:
        result = read(path)
    except HandoffError as exc:
        return None, f"handoff file invalid: {exc}"
    return result.doc, result.reason
