"""A supervised sim fleet behind one router (``Stack``, ``start_stack``) and steady client load
(``client_load``), for the lifecycle tests and the restart benches."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonschema

from narwhal_testing import loopback
from narwhal_testing.fleet import FAST, SimEngine, start_supervisor, write_fleet
from narwhal_testing.procs import ProcGroup
from narwhal_testing.router import RouterHandle, start_router
from narwhal_testing.waits import wait_for
from router.lifecycle.document import SCHEMA_PATH

__all__ = ["FAST", "SCHEMA", "Load", "Stack", "client_load", "running_threads", "start_stack", "wait_for"]

SCHEMA = json.loads(SCHEMA_PATH.read_text())
# Built (and the schema checked) once: ``jsonschema.validate`` re-checks the schema against its
# meta-schema on every call (~40 ms of CPU), and the lifecycle document is read in polling waits.
_VALIDATOR = jsonschema.validators.validator_for(SCHEMA)(SCHEMA)
_VALIDATOR.check_schema(SCHEMA)


def validate(doc: Any) -> None:
    """``jsonschema.validate(doc, SCHEMA)`` with the prebuilt validator: the same best-match error."""
    error = jsonschema.exceptions.best_match(_VALIDATOR.iter_errors(doc))
    if error is not None:
        raise error


@dataclass
class Stack:
    router: RouterHandle
    supervisor: str
    sims: list[SimEngine]

    def url(self, iid: str) -> str:
        return next(s.url for s in self.sims if s.iid == iid)

    def lifecycle(self) -> dict[str, Any]:
        doc: dict[str, Any] = self.router.get("/narwhal/lifecycle").json()
        validate(doc)
        return doc

    def post(self, action: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        r = self.router.post(f"/narwhal/lifecycle/{action}", body, timeout=60)
        doc: dict[str, Any] = r.json()
        validate(doc)
        return r.status_code, doc

    def restart(self, iid: str) -> dict[str, Any]:
        r = loopback.post(f"{self.supervisor}/engines/{iid}/restart", timeout=60)
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out

    def supervise(self, iid: str, action: str) -> None:
        loopback.post(f"{self.supervisor}/engines/{iid}/{action}", timeout=60).raise_for_status()


def start_stack(
    group: ProcGroup, tmp_path: Path, n: int = 3, policy: str = "individual", extra: dict[str, Any] | None = None,
    **sim_opts: Any,
) -> Stack:  # fmt: skip
    sup, sims = start_supervisor(group, tmp_path, n, **sim_opts)
    merged = json.loads(json.dumps(FAST))
    for key, value in (extra or {}).items():
        merged.setdefault(key, {}).update(value)
    fleet = write_fleet(tmp_path, sims, policy=policy, extra=merged)
    router = start_router(group, fleet, tmp_path, wait_ready=True)
    return Stack(router, sup, sims)


@contextmanager
def running_threads(
    worker: Callable[[int], None], workers: int, stop: threading.Event, join_timeout: float = 30.0
) -> Iterator[None]:
    """``workers`` daemon threads running ``worker(i)`` while the block runs; at its end ``stop``
    is set and each thread is joined (bounded by ``join_timeout``)."""
    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=join_timeout)


@dataclass
class Load:
    ok: int = 0
    failed: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


@contextmanager
def client_load(router_url: str, workers: int = 4, max_tokens: int = 24) -> Iterator[Load]:
    """Continuous completions (half streamed) until the block ends; failures are recorded."""
    load = Load()
    lock = threading.Lock()

    def worker(i: int) -> None:
        with loopback.client(timeout=30) as client:
            while not load.stop.is_set():
                body = {
                    "model": "sim-model",
                    "prompt": f"load {i}",
                    "max_tokens": max_tokens,
                    "stream": i % 2 == 0,
                }
                try:
                    r = client.post(router_url + "/v1/completions", json=body)
                    good = r.status_code == 200 and ("error" not in r.text[-400:] if body["stream"] else True)
                    detail = f"{r.status_code} {r.text[:200]}"
                except httpx.HTTPError as exc:
                    good, detail = False, repr(exc)
                with lock:
                    if good:
                        load.ok += 1
                    else:
                        load.failed.append(detail)

    with running_threads(worker, workers, load.stop):
        yield load
