"""The HA process harness: ``narwhal-serve`` routers on one lease file (a primary and a warm
standby), with lease timings that a loaded 2-core host does not lose, and the readers the HA tests
and drills use (``/ready`` status, epoch, whether a router controls, an engine's lifecycle view).

Each router ``<name>`` gets its own fleet file ``<name>.fleet.json`` and state file
``<name>.state.json`` (in ``state_dir``, default the test directory) and ``--router-id
router-<name>``; the lease is ``router.lease`` in the test directory unless a path is given.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from narwhal_testing.fleet import FAST, SimEngine, write_fleet
from narwhal_testing.procs import ProcGroup
from narwhal_testing.router import RouterHandle, start_router
from narwhal_testing.waits import wait_for

# A 2 s lease renewed every 0.3 s, valid locally until 0.4 s before it expires: short enough for
# quick takeovers, long enough that a renewal delayed by a busy host does not lose it.
LEASE_TTL_S = 2.0
LEASE = ["--lease-ttl", str(LEASE_TTL_S), "--lease-renew-interval", "0.3", "--lease-safety-margin", "0.4"]
# The standby probes every 0.05 s and takes over after 2 missed probes and an expired lease.
STANDBY = [
    "--standby-probe-interval", "0.05",
    "--standby-takeover-after", "2",
    "--standby-max-handoff-age", "5",
]  # fmt: skip
NOT_CONTROLLING = "this router does not control the fleet"


def ha_fleet(
    tmp: Path,
    sims: Sequence[SimEngine],
    name: str,
    state_dir: Path | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """``<name>.fleet.json`` in ``tmp`` with state file ``<state_dir>/<name>.state.json``."""
    state = (state_dir or tmp) / f"{name}.state.json"
    return write_fleet(tmp, sims, name=f"{name}.fleet.json", state_path=str(state), extra=extra or FAST)


def ha_router(
    group: ProcGroup,
    tmp: Path,
    sims: Sequence[SimEngine],
    name: str,
    *args: str,
    lease_path: Path | None = None,
    state_dir: Path | None = None,
    extra: dict[str, Any] | None = None,
    **kw: Any,
) -> RouterHandle:
    """Router ``name`` on the shared lease; ``args`` are more ``narwhal-serve`` flags, ``kw`` go to
    ``start_router`` (``wait_ready``, ``env``, ...)."""
    fleet = ha_fleet(tmp, sims, name, state_dir=state_dir, extra=extra)
    lease = ["--lease-path", str(lease_path or tmp / "router.lease"), "--router-id", f"router-{name}", *LEASE]
    return start_router(group, fleet, tmp, [*lease, *args], name=name, **kw)


def standby_router(
    group: ProcGroup,
    tmp: Path,
    sims: Sequence[SimEngine],
    primary: RouterHandle,
    *args: str,
    name: str = "b",
    **kw: Any,
) -> RouterHandle:
    """Router ``name`` as the warm standby of ``primary`` (``STANDBY`` timings)."""
    return ha_router(group, tmp, sims, name, "--standby-of", primary.url, *STANDBY, *args, **kw)


def start_pair(
    group: ProcGroup, tmp: Path, sims: Sequence[SimEngine], **kw: Any
) -> tuple[RouterHandle, RouterHandle]:
    """Primary ``a`` (ready: it holds the lease) and standby ``b``, returned once the standby has
    mirrored the primary's handoff into its own state file."""
    a = ha_router(group, tmp, sims, "a", wait_ready=True, **kw)
    b = standby_router(group, tmp, sims, a, **kw)
    state = (kw.get("state_dir") or tmp) / "b.state.json"
    wait_for("standby mirror", state.exists, timeout=30)
    return a, b


def sigstop_outside_lease_lock(router: RouterHandle, lease_path: Path, timeout: float = 30.0) -> None:
    """SIGSTOP ``router`` while this process holds the lease file's lock, so the router is frozen
    between two renewals, never inside its locked read-modify-write of the record. (A holder frozen
    inside it keeps the ``flock`` and every claim fails with "lease lock busy" until it is thawed:
    another scenario than a frozen holder, which a loaded host would otherwise pick at random.)"""
    lock_path = Path(str(lease_path) + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        give_up = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= give_up:
                    raise AssertionError(f"lease lock {lock_path} busy for {timeout}s") from None
                time.sleep(0.005)
        router.proc.signal(signal.SIGSTOP)
    finally:
        os.close(fd)  # releases the lock


def sigstop_inside_lease_lock(router: RouterHandle, lease_path: Path, timeout: float = 60.0) -> None:
    """SIGSTOP ``router`` *inside* its locked read-modify-write of the lease record, so it keeps the
    lease file's ``flock`` while frozen (every other claim: "lease lock busy"). Catches the lock busy
    (a renewal in progress), stops the router, and checks the lock stays held; otherwise (the router
    had just left, or the busy lock was another router's brief claim) the router is thawed and the
    next renewal is tried."""
    lock_path = Path(str(lease_path) + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        give_up = time.monotonic() + timeout
        while time.monotonic() < give_up:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # the router is inside its critical section right now
                router.proc.signal(signal.SIGSTOP)
                if _stays_locked(fd, 0.5):
                    return  # frozen with the lock held
                router.proc.signal(signal.SIGCONT)  # it had just left: try the next renewal
                continue
            fcntl.flock(fd, fcntl.LOCK_UN)
            time.sleep(0.0002)  # leave the lock to the router most of the time
        raise AssertionError(f"never caught {router.url} inside its lease lock in {timeout}s")
    finally:
        os.close(fd)


def _stays_locked(fd: int, for_s: float) -> bool:
    """The lease lock stays busy for ``for_s`` (held by a frozen process, not a peer's brief claim:
    a standby whose probes missed under load takes it for a moment too)."""
    until = time.monotonic() + for_s
    while time.monotonic() < until:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            time.sleep(0.01)
            continue
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    return True


def state_file(tmp: Path, name: str, state_dir: Path | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(((state_dir or tmp) / f"{name}.state.json").read_text())
    return doc


# -- readers ------------------------------------------------------------------------------------


def ready(router: RouterHandle) -> tuple[int, dict[str, Any]]:
    """(status, body) of ``/ready``; (0, {}) while the router does not answer."""
    try:
        r = router.get("/ready", timeout=2.0)
    except httpx.HTTPError:
        return 0, {}
    try:
        body = r.json()
    except ValueError:
        body = {}
    return r.status_code, body if isinstance(body, dict) else {}


def controls(router: RouterHandle) -> bool:
    return ready(router)[0] == 200


def controller(*routers: RouterHandle) -> RouterHandle | None:
    """The first of ``routers`` that controls the fleet (None: none does)."""
    return next((r for r in routers if controls(r)), None)


def epoch_of(router: RouterHandle) -> int:
    """The lease epoch ``/ready`` reports (0 while the router does not answer)."""
    return int(ready(router)[1].get("epoch", 0))


def wait_controls(router: RouterHandle, timeout: float = 30.0) -> None:
    wait_for(f"{router.url} controls the fleet", lambda: controls(router), timeout=timeout)


def resumed(router: RouterHandle) -> bool:
    """The router has decided about the handoff it found at start (applied or not)."""
    out = router.proc.output()
    return "handoff applied" in out or "handoff not applied" in out


def drain(router: RouterHandle, iid: str, deadline_s: float = 300) -> httpx.Response:
    return router.post("/narwhal/lifecycle/drain", {"engines": [iid], "deadline_s": deadline_s}, timeout=30)


def engine_state(router: RouterHandle, iid: str) -> dict[str, Any]:
    doc: dict[str, Any] = router.get("/narwhal/lifecycle").json()["engines"][iid]
    return doc


def held(router: RouterHandle, iid: str) -> bool:
    """The engine is held out of placement by a drain (draining or drained, not accepting new)."""
    e = engine_state(router, iid)
    return e["state"] in ("draining", "drained") and e["accepts_new"] is False
