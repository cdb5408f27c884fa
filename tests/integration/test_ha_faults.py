"""HA on bad days, with real router processes, SIGKILL and real files: epochs never go backwards,
``--resume`` finds the newest state whichever router starts first after both stopped, a corrupt or
deleted lease record is recovered (never fatal, never a restarted epoch), and planted symlinks in
the state and lease directories are refused, never followed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.fleet import start_sims
from tests.support.ha import engine_state, epoch_of, ha_router, held, resumed, start_pair
from tests.support.procs import proc_group
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
        assert "lease record recovered: lease record is not valid JSON" in a.proc.output()
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
