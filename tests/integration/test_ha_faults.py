"""HA on bad days, with real router processes, SIGKILL and real files: epochs never go backwards,
``--resume`` finds the newest state whichever router starts first after both stopped, a corrupt or
deleted lease record is recovered (never fatal, never a restarted epoch), and planted symlinks in
the state and lease directories are refused, never followed."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.support.fleet import restart_sim, start_sims
from tests.support.ha import (
    LEASE_TTL_S,
    STANDBY,
    controls,
    drain,
    engine_state,
    epoch_of,
    ha_router,
    held,
    ready,
    resumed,
    sigstop_inside_lease_lock,
    start_pair,
    state_file,
    wait_controls,
)
from tests.support.procs import free_port, proc_group
from tests.support.router import RouterHandle
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("first", ["a", "b"])
def test_both_routers_down_then_either_resumes_the_newest_state(tmp_path: Path, first: str) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3, itl_ms=2)
        a, b = start_pair(group, tmp_path, sims)
        a.proc.kill9()
        wait_for("b takes over", lambda: epoch_of(b) == 2, timeout=30)
        r = b.post("/narwhal/lifecycle/drain", {"engines": ["e2"], "deadline_s": 120})
        assert r.status_code == 200, r.text  # acknowledged by the epoch-2 holder only
        b.proc.stop()  # both routers are down now; a.state.json still holds epoch 1
        assert json.loads((tmp_path / "a.state.json").read_text())["epoch"] == 1
        second = "b" if first == "a" else "a"
        one = ha_router(group, tmp_path, sims, first, "--resume")
        wait_for("first resume", lambda: resumed(one))
        assert "handoff applied" in one.proc.output(), one.proc.output()[-2000:]
        assert epoch_of(one) == 3  # above every epoch seen, never a whole-wave hold
        assert held(one, "e2")
        one.proc.stop()
        two = ha_router(group, tmp_path, sims, second, "--resume")
        wait_for("second resume", lambda: resumed(two))
        assert "handoff applied" in two.proc.output(), two.proc.output()[-2000:]
        assert epoch_of(two) == 4
        assert engine_state(two, "e2")["state"] in ("draining", "drained")
        assert two.get("/ready").json()["reason"] != "whole-wave restart required"


def test_corrupt_lease_is_rewritten_by_its_holder_and_recovered_by_the_standby(tmp_path: Path) -> None:
    lease_path = tmp_path / "router.lease"
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3, itl_ms=2)
        a, b = start_pair(group, tmp_path, sims)
        lease_path.write_text('{"epoch": 1, "holder": ')  # torn record while the holder is alive
        wait_for(
            "holder rewrites the record",
            lambda: "rewritten by the holder" in a.get("/ready").json()["lease_problem"],
        )
        assert json.loads(lease_path.read_text())["epoch"] == 1  # parses again, same epoch
        # the log line and /ready's lease_problem are set together; the log reaches us through a pipe
        wait_for(
            "holder logs the recovery",
            lambda: "lease record recovered: lease record is not valid JSON" in a.proc.output(),
        )
        assert epoch_of(a) == 1 and a.get("/ready").status_code == 200
        # never a second controller; a standby whose probes missed under load may have seen the torn
        # record meanwhile (``lease record damaged`` on its /ready), which its next good probe clears
        wait_for(
            "standby shadows the holder again",
            lambda: b.get("/ready").json()["reason"] in ("shadowing", ""),
            timeout=60,
        )
        assert not b.get("/ready").json()["control_ready"]
        assert epoch_of(a) == 1 and "TAKEOVER" not in b.proc.output()
        # now the holder dies and the record is corrupt: the standby waits it out, claims above it
        a.proc.kill9()
        lease_path.write_bytes(b"\x00garbage")
        wait_for("standby takes over", lambda: epoch_of(b) >= 2, timeout=30)
        assert epoch_of(b) == 2
        assert "standby: lease record recovered" in b.proc.output()
        assert json.loads(lease_path.read_text())["epoch"] == 2


def test_deleted_lease_is_claimed_above_every_epoch_seen(tmp_path: Path) -> None:
    lease_path = tmp_path / "router.lease"
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3, itl_ms=2)
        a, b = start_pair(group, tmp_path, sims)
        r = a.post("/narwhal/lifecycle/drain", {"engines": ["e1"], "deadline_s": 120})
        assert r.status_code == 200, r.text
        a.proc.kill9()
        lease_path.unlink()
        wait_for("standby takes over", lambda: epoch_of(b) >= 2, timeout=30)
        assert epoch_of(b) == 2  # not 1: the epoch never restarts
        assert "cannot precede" not in b.proc.output()
        assert engine_state(b, "e1")["state"] in ("draining", "drained")
        b.proc.stop()
        # and a fresh start on the deleted lease still claims above every handoff epoch it can read
        lease_path.unlink()
        c = ha_router(group, tmp_path, sims, "a", "--resume", wait_ready=False)
        wait_for("resume", lambda: resumed(c))
        assert epoch_of(c) == 3 and engine_state(c, "e1")["state"] in ("draining", "drained")


def test_planted_symlinks_are_refused_and_nothing_outside_is_written(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "passwd"
    victim.write_text("root:x:0:0:root:/root:/bin/bash\n")
    planted = {
        tmp_path / "a.state.json": victim,  # a state file that is a symlink to a foreign file
        tmp_path / "a.state.json.rejected": outside / "rejected-target",  # evidence copy target
        tmp_path / "router.lease.lock": outside / "lock-target",  # lock file (opened O_CREAT)
    }
    for link, target in planted.items():
        link.symlink_to(target)
    before = {p.name: p.read_bytes() for p in outside.iterdir()}
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3, itl_ms=2)
        a = ha_router(group, tmp_path, sims, "a", "--resume")
        wait_for(
            "the lock symlink is named",
            lambda: (
                "symbolic link" in a.get("/ready").json()["reason"]
                or "Too many levels of symbolic links" in a.get("/ready").json()["reason"]
            ),
        )
        assert not a.get("/ready").json()["control_ready"]  # no lease through a planted lock link
        (tmp_path / "router.lease.lock").unlink()  # the operator removes it: claimed, resumed
        wait_for("resume", lambda: resumed(a), timeout=30)
        out = a.proc.output()
        assert "handoff file symlink" in out and "is a symbolic link (refused, not followed)" in out
        assert "refused state file not copied" in out
        ready = a.get("/ready").json()
        assert ready["reason"].startswith(
            "whole-wave restart required: handoff rejected: handoff file symlink"
        )
        # the state file write refuses the link: reported, and the shared copy keeps the state durable
        wait_for("state write refused", lambda: "symbolic link" in a.get("/ready").json()["control_degraded"])
        a.proc.stop()
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == before  # nothing written outside
    assert (tmp_path / "a.state.json").is_symlink() and (tmp_path / "a.state.json.rejected").is_symlink()


def test_planted_journal_symlink_is_refused_at_start_and_nothing_outside_is_written(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "authorized_keys"
    victim.write_text("ssh-ed25519 AAAA... operator\n")
    (tmp_path / "a.journal.jsonl").symlink_to(victim)  # the journal path of router "a"
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 1, itl_ms=2)
        with pytest.raises(RuntimeError, match="process exited") as exc:
            ha_router(group, tmp_path, sims, "a", "--resume")
    message = str(exc.value)
    assert (
        "narwhal-serve: error:" in message and "journal is a symbolic link (refused, not followed)" in message
    )
    assert str(tmp_path / "a.journal.jsonl") in message
    assert victim.read_text() == "ssh-ed25519 AAAA... operator\n"  # nothing appended through the link
    assert sorted(p.name for p in outside.iterdir()) == ["authorized_keys"]
    assert not (tmp_path / "a.state.json").exists()  # refused before anything was claimed or written


def _one_controller(*routers: RouterHandle) -> RouterHandle | None:
    holders = [r for r in routers if controls(r)]
    assert len(holders) <= 1, [r.url for r in holders]
    return holders[0] if holders else None


@pytest.mark.parametrize("first", ["primary", "standby"])
def test_both_down_and_restarted_within_the_ttl_in_either_order_end_with_one_controller(
    tmp_path: Path, first: str
) -> None:
    """Both routers killed while the last holder's lease still stands, restarted within 1 s of each
    other (``a --resume`` and ``b --standby-of a``, either first): one of them controls with the
    newest state (the drain the last holder acknowledged), the other shadows it or is fenced."""
    lease_path = tmp_path / "router.lease"
    ttl = ["--lease-ttl", "6"]  # longer than a router's start-up: restarted while the lease stands
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3, itl_ms=2)
        a = ha_router(group, tmp_path, sims, "a", *ttl, wait_ready=True)
        b = ha_router(group, tmp_path, sims, "b", "--standby-of", a.url, *STANDBY, *ttl)
        wait_for("b shadows", lambda: ready(b)[1].get("reason") == "shadowing", timeout=60)
        a.proc.kill9()
        wait_for("b takes over", lambda: epoch_of(b) == 2, timeout=60)
        r = drain(b, "e2")
        assert r.status_code == 200, r.text  # acknowledged by the epoch-2 holder only
        b.proc.kill9()  # both down; b's lease has not expired
        died = time.monotonic()
        assert json.loads(lease_path.read_text())["expires_at"] > time.time()
        port_a = free_port()
        starts = {
            "primary": lambda: ha_router(
                group, tmp_path, sims, "a", "--resume", *ttl, port=port_a, wait=False
            ),
            "standby": lambda: ha_router(
                group,
                tmp_path,
                sims,
                "b",
                "--standby-of",
                f"http://127.0.0.1:{port_a}",
                *STANDBY,
                *ttl,
                wait=False,
            ),
        }
        second = "standby" if first == "primary" else "primary"
        started = {first: starts[first]()}
        started[second] = starts[second]()
        a2, b2 = started["primary"], started["standby"]
        holder = wait_for("one controller", lambda: _one_controller(a2, b2), timeout=60)
        took = time.monotonic() - died
        assert holder is not None
        assert took <= 6 + 5, f"one controller {took:.1f}s after both died: over TTL + 5 s"
        other = b2 if holder is a2 else a2
        assert epoch_of(holder) == 3, ready(holder)
        assert held(holder, "e2")
        settled = ("shadowing",) if other is b2 else ("lease held by another router",)
        wait_for("the other settles", lambda: ready(other)[1].get("reason") in settled, timeout=60)
        assert _one_controller(a2, b2) is holder and epoch_of(holder) == 3
        name = "a" if holder is a2 else "b"
        print(f"{first} first: {name} controls {took:.1f}s after both died (TTL 6s)")


def test_lease_unclaimable_past_the_max_handoff_age_then_holder_killed_standby_takes_over(
    tmp_path: Path,
) -> None:
    """The primary frozen inside its lease lock (the flock held: every claim "lease lock busy") for
    longer than ``standby_max_handoff_age_s``, then killed: the standby claims and takes over from
    the durable shared handoff, however old, with every acknowledged change."""
    lease_path = tmp_path / "router.lease"
    shared = tmp_path / "router.lease.handoff.json"
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3, itl_ms=2)
        a, b = start_pair(group, tmp_path, sims)
        assert drain(a, "e0").status_code == 200  # acknowledged: drain e0, readmit it, drain e1
        wait_for("e0 drained", lambda: engine_state(a, "e0")["state"] == "drained", timeout=60)
        restart_sim(group, sims[0])
        r = a.post("/narwhal/lifecycle/readmit", {"engines": ["e0"]}, timeout=60)
        assert r.status_code == 200, r.text
        r = drain(a, "e1")
        assert r.status_code == 200, r.text
        sigstop_inside_lease_lock(a, lease_path)
        at = json.loads(shared.read_text())["at"]
        max_age = float(STANDBY[STANDBY.index("--standby-max-handoff-age") + 1])
        wait_for(
            "every handoff is older than the max age", lambda: time.time() - at > max_age + 1, timeout=60
        )
        # blocked by the lock, not "no fresh handoff": the durable copy has no age limit
        reasons: list[str] = []

        def blocked_by_the_lock() -> bool:
            reasons.append(ready(b)[1].get("reason", ""))
            return "busy" in reasons[-1]

        try:
            wait_for("standby blocked by the lock", blocked_by_the_lock, timeout=30)
        except AssertionError:
            raise AssertionError(
                f"standby reasons: {sorted(set(reasons))}\n{b.proc.output()[-3000:]}"
            ) from None
        assert not controls(b)
        a.proc.signal(signal.SIGCONT)  # (a SIGKILL reaches a stopped process too; thawed for a clean log)
        a.proc.kill9()
        died = time.monotonic()
        wait_controls(b, timeout=60)
        took = time.monotonic() - died
        assert took <= LEASE_TTL_S + 5, f"standby controls {took:.1f}s after the kill: over TTL + 5 s"
        assert epoch_of(b) == 2
        assert held(b, "e1")
        e0 = engine_state(b, "e0")
        assert e0["state"] == "active" and e0["accepts_new"], e0
        assert "no fresh handoff" not in ready(b)[1].get("reason", "")
        print(f"standby controls {took:.1f}s after the frozen holder was killed (TTL {LEASE_TTL_S}s)")


def test_lease_and_shared_handoff_deleted_the_next_epoch_is_above_every_epoch_seen(tmp_path: Path) -> None:
    """``rm router.lease router.lease.handoff.json`` after a takeover: router ``a`` (which last saw
    epoch 1) claims above the epoch ``b`` held, from the epoch floor beside the lease; and with the
    floor deleted too, the last holder claims above its own epoch, from its own state file (written
    at the claim, before anything else)."""
    lease_path = tmp_path / "router.lease"
    shared = tmp_path / "router.lease.handoff.json"
    floor = tmp_path / "router.lease.epoch"
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3, itl_ms=2)
        a, b = start_pair(group, tmp_path, sims)
        a.proc.kill9()
        wait_for("b takes over", lambda: epoch_of(b) == 2, timeout=60)
        assert drain(b, "e2").status_code == 200
        b.proc.kill9()
        assert json.loads((tmp_path / "a.state.json").read_text())["epoch"] == 1  # a never saw 2
        lease_path.unlink()
        shared.unlink()
        assert floor.read_text() == "2\n"
        a2 = ha_router(group, tmp_path, sims, "a", "--resume", wait=False)
        wait_controls(a2, timeout=60)
        assert epoch_of(a2) == 3  # not 2 again
        wait_for("a's state file holds epoch 3", lambda: state_file(tmp_path, "a")["epoch"] == 3, timeout=30)
        a2.proc.kill9()  # the last holder; now the whole lease directory's state goes
        for p in (lease_path, shared, floor):
            p.unlink()
        a3 = ha_router(group, tmp_path, sims, "a", "--resume", wait=False)
        wait_controls(a3, timeout=60)
        assert epoch_of(a3) == 4
        assert floor.read_text() == "4\n"
