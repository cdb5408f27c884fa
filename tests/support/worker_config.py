"""The worker configuration file the tests' ``narwhal-worker`` processes read (``--config``).

One file per pytest process: every worker a test starts reads it, and a test adds the routers it
started (``allow_routers``) and the command templates it needs (``add_template``) before it starts
a workflow — the worker re-reads the file when it changes, as an operator's edit would be read.
Written atomically (temporary file + rename).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any


class WorkerConfigFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.doc: dict[str, Any] = {
            "schema": "narwhal.worker-config",
            "schema_version": 1,
            "routers": {},
            "templates": {},
        }
        self._lock = threading.Lock()
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.doc, indent=2))
        os.replace(tmp, self.path)

    def allow_routers(self, urls: list[str], token_env: str = "", name: str = "") -> str:
        """Configure a router (every URL the worker may call for it); returns its name."""
        urls = [u.rstrip("/") for u in urls]
        name = name or "r-" + hashlib.sha256(",".join(urls).encode()).hexdigest()[:10]
        entry: dict[str, Any] = {"urls": urls}
        if token_env:
            entry["token_env"] = token_env
        with self._lock:
            self.doc["routers"][name] = entry
            self._write()
        return name

    def add_template(self, command: str, name: str = "", **options: Any) -> str:
        name = name or "t-" + hashlib.sha256(command.encode()).hexdigest()[:10]
        with self._lock:
            self.doc["templates"][name] = {"command": command, **options}
            self._write()
        return name


_SESSION: WorkerConfigFile | None = None


def session_worker_config() -> WorkerConfigFile:
    """This pytest process's file (created on first use, in a private temporary directory)."""
    global _SESSION
    if _SESSION is None:
        _SESSION = WorkerConfigFile(Path(tempfile.mkdtemp(prefix="narwhal-worker-config-")) / "worker.json")
    return _SESSION
