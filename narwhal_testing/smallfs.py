"""A real small filesystem for fault tests: a tmpfs of a few KiB that can be filled or made read-only.

``small_tmpfs(path)`` mounts (needs root, as CI is) and always unmounts, even when the test fails;
``fill()`` writes a filler file until ENOSPC, ``free()`` removes it, ``read_only()`` /
``read_write()`` remount. Used by the durability tests and ``bench/durable_drill.py``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, check=False)


@dataclass
class SmallFs:
    path: Path

    @property
    def filler(self) -> Path:
        return self.path / "filler.bin"

    def fill(self) -> int:
        """Write until the filesystem is full; returns the bytes written."""
        written = 0
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            chunk = b"\0" * 4096
            while True:
                try:
                    written += os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
            for size in (1024, 256, 64, 16, 1):  # the last partial page too
                with contextlib.suppress(OSError):
                    while True:
                        written += os.write(fd, b"\0" * size)
        finally:
            os.close(fd)
        return written

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.filler.unlink()

    def read_only(self) -> None:
        self._remount("ro")

    def read_write(self) -> None:
        self._remount("rw")

    def _remount(self, mode: str) -> None:
        r = _run("mount", "-o", f"remount,{mode}", str(self.path))
        if r.returncode != 0:
            raise RuntimeError(f"remount {mode} {self.path} failed: {r.stderr.strip()}")


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "64k") -> Iterator[SmallFs]:
    """Mount a ``size`` tmpfs at ``path`` for the block; unmounted afterwards whatever happens."""
    path.mkdir(parents=True, exist_ok=True)
    r = _run("mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path))
    if r.returncode != 0:
        raise RuntimeError(f"cannot mount a tmpfs at {path} (root needed): {r.stderr.strip()}")
    fs = SmallFs(path)
    try:
        yield fs
    finally:
        _run("mount", "-o", "remount,rw", str(path))
        if _run("umount", str(path)).returncode != 0:
            _run("umount", "-l", str(path))  # a process still holds a file there: detach now
