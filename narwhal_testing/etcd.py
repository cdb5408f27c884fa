"""A real etcd cluster for integration tests: members are child processes on free loopback ports,
with data dirs in a temp directory, stopped (or frozen) by their PID — never by name.

``EtcdCluster(n=3)`` starts the members in parallel and waits until a leader answers. Members can
be stopped (``stop(i)``), restarted on the same ports and data dir (``start(i)``), frozen
(``freeze(i)`` = SIGSTOP) and thawed. ``leader()`` finds the leader via the JSON gateway's
``maintenance/status``.
"""

from __future__ import annotations

import base64
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from narwhal_testing import loopback
from narwhal_testing.procs import Proc, free_port

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def etcd_installed() -> bool:
    return shutil.which("etcd") is not None or Path("/usr/bin/etcd").exists()


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    proc: Proc | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()


class EtcdCluster:
    def __init__(self, base: Path, n: int = 3, token: str = "") -> None:
        self.base = base
        base.mkdir(parents=True, exist_ok=True)
        self.token = token or f"narwhal-test-{free_port()}"
        self.members = [Member(f"m{i}", free_port(), free_port(), base / f"m{i}.data") for i in range(n)]
        self.initial_cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        self._generation = 0

    @property
    def endpoints(self) -> str:
        return ",".join(m.url for m in self.members)

    def start_all(self, timeout: float = 60.0) -> None:
        for i in range(len(self.members)):
            self.start(i, wait=False)
        self.wait_healthy(timeout)

    def start(self, i: int, wait: bool = True, timeout: float = 60.0) -> None:
        m = self.members[i]
        if m.alive():
            return
        state = "existing" if m.data_dir.exists() else "new"
        self._generation += 1
        args = [
            ETCD,
            "--name", m.name,
            "--data-dir", str(m.data_dir),
            "--listen-client-urls", m.url,
            "--advertise-client-urls", m.url,
            "--listen-peer-urls", m.peer_url,
            "--initial-advertise-peer-urls", m.peer_url,
            "--initial-cluster", self.initial_cluster,
            "--initial-cluster-state", state,
            "--initial-cluster-token", self.token,
            "--heartbeat-interval", "100",
            "--election-timeout", "1000",
            "--log-level", "warn",
        ]  # fmt: skip
        m.proc = Proc(args, self.base / f"{m.name}.{self._generation}.log")
        if wait:
            self.wait_member(i, timeout)

    def stop(self, i: int) -> None:
        """SIGKILL the member by PID (a crash, not a graceful leave: it stays in the cluster)."""
        m = self.members[i]
        if m.proc is not None and m.proc.alive():
            m.proc.signal(signal.SIGCONT)
            m.proc.kill9()
        if m.proc is not None:
            m.proc.stop()

    def freeze(self, i: int) -> None:
        proc = self.members[i].proc
        if proc is not None:
            proc.signal(signal.SIGSTOP)

    def thaw(self, i: int) -> None:
        proc = self.members[i].proc
        if proc is not None:
            proc.signal(signal.SIGCONT)

    def close(self) -> None:
        for i in range(len(self.members)):
            self.stop(i)

    # -- state -------------------------------------------------------------------------------
    def status(self, i: int, timeout: float = 1.0) -> dict[str, str] | None:
        m = self.members[i]
        try:
            r = loopback.post(m.url + "/v3/maintenance/status", json={}, timeout=timeout, trust_env=False)
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        doc = r.json()
        return doc if isinstance(doc, dict) else None

    def member_id(self, i: int) -> str:
        st = self.status(i)
        return st["header"]["member_id"] if st else ""  # type: ignore[index]

    def leader(self) -> int | None:
        """Index of the member that is leader now (as reported by a live member), None without quorum."""
        for i, m in enumerate(self.members):
            if not m.alive():
                continue
            st = self.status(i)
            if not st or not st.get("leader") or st.get("leader") == "0":
                continue
            for j in range(len(self.members)):
                if self.members[j].alive() and self.member_id(j) == st["leader"]:
                    return j
        return None

    def healthy(self, i: int) -> bool:
        """The member answers a linearizable read (it is part of a quorum)."""
        m = self.members[i]
        try:
            r = loopback.post(m.url + "/v3/kv/range", json={"key": "aGVhbHRo"}, timeout=1.5, trust_env=False)
        except httpx.HTTPError:
            return False
        return r.status_code == 200 and "header" in r.json()

    def wait_member(self, i: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self.members[i]
            if m.proc is not None and not m.proc.alive():
                raise RuntimeError(f"etcd {m.name} exited:\n{m.proc.output()[-3000:]}")
            if self.healthy(i):
                return
            time.sleep(0.1)
        raise TimeoutError(f"etcd member {self.members[i].name} not healthy after {timeout}s")

    def wait_healthy(self, timeout: float = 60.0) -> None:
        for i, m in enumerate(self.members):
            if m.alive():
                self.wait_member(i, timeout)

    def wait_leader(self, timeout: float = 60.0, other_than: int | None = None) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None and leader != other_than and self.healthy(leader):
                return leader
            time.sleep(0.1)
        raise TimeoutError(f"no etcd leader after {timeout}s")

    # -- direct KV access for assertions (etcd's JSON gateway, any live member) ---------------------
    def _gateway(self, path: str, body: dict[str, object], what: str) -> dict[str, Any]:
        """POST ``body`` to ``/v3/kv/<path>`` of the first live member that answers 200."""
        for m in self.members:
            if not m.alive():
                continue
            try:
                r = loopback.post(m.url + "/v3/kv/" + path, json=body, timeout=3.0, trust_env=False)
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                doc: dict[str, Any] = r.json()
                return doc
        raise RuntimeError(f"no etcd member {what}")

    def get(self, key: str) -> dict[str, object] | None:
        """The key as the gateway returns it (value decoded to str), from any healthy member."""
        kvs = self._gateway("range", {"key": _b64(key.encode())}, "answered").get("kvs", [])
        if not kvs:
            return None
        kv = dict(kvs[0])
        kv["value"] = base64.b64decode(kv.get("value", "")).decode("utf-8", "replace")
        return kv

    def keys(self, prefix: str) -> list[str]:
        """Every key under ``prefix``, sorted."""
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        body = {"key": _b64(prefix.encode()), "range_end": _b64(end.encode()), "keys_only": True}
        kvs = self._gateway("range", body, "answered").get("kvs", [])
        return sorted(base64.b64decode(kv["key"]).decode() for kv in kvs)

    def put(self, key: str, value: bytes) -> None:
        self._gateway("put", {"key": _b64(key.encode()), "value": _b64(value)}, "accepted the put")

    def delete(self, key: str) -> int:
        """``etcdctl del <key>``: how many keys were deleted."""
        doc = self._gateway("deleterange", {"key": _b64(key.encode())}, "accepted the delete")
        return int(doc.get("deleted", 0))


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()
