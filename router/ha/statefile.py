"""The handoff state file (``recovery.state_path``, spec §2.3): atomic write, tolerant load.

``write`` validates, writes a unique temp file in the same directory, fsyncs it, ``os.replace``s it
onto the target, fsyncs the directory (so the rename survives a power cut) and always removes the
temp file. ``load`` returns None for a missing, unreadable, torn or non-UTF-8 file (nothing usable
was persisted) and raises ``HandoffError`` for a parseable document that fails validation.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from pathlib import Path

from router.ha.handoff import Handoff, HandoffError, validate


def shared_handoff_path(lease_path: str) -> Path:
    """The lease holder's handoff beside the shared lease file (both routers see that directory).

    The holder writes it before answering any lifecycle change, so a takeover never misses a drain
    that was acknowledged after the standby's last poll.
    """
    return Path(lease_path + ".handoff.json")


def temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(path: str | Path, doc: Handoff) -> None:
    """Atomically replace ``path`` with the validated document (OSError on I/O failure)."""
    target = Path(path)
    data = (json.dumps(validate(doc).dump(), allow_nan=False) + "\n").encode()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(target)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def load(path: str | Path) -> Handoff | None:
    """The persisted document; None when there is nothing usable; raises when it is invalid."""
    try:
        raw = Path(path).read_bytes()
    except OSError:
        return None
    try:
        text = raw.decode("utf-8")
        doc = json.loads(text)
    except (UnicodeDecodeError, ValueError):
        return None  # torn (partial write without the atomic rename) or not text
    return validate(doc)


def load_reason(path: str | Path) -> tuple[Handoff | None, str]:
    """``load`` that never raises: (document, "") or (None, why nothing can be applied)."""
    try:
        doc = load(path)
    except HandoffError as exc:
        return None, f"handoff file invalid: {exc}"
    return doc, ("" if doc is not None else "no handoff file")
