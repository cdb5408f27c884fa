"""Readiness tells the truth: an engine that does not serve the configured model is not placement-
eligible, and /ready, the lifecycle document and /narwhal/state say why. The README's "run the
router by hand" example runs as written (only its ports are swapped for free ones)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.support import loopback
from tests.support.fleet import reset_faults, set_fault, start_sims, write_fleet
from tests.support.lifecycle import FAST, wait_for
from tests.support.procs import BIN, REPO, Proc, free_port, proc_group
from tests.support.router import start_router

pytestmark = pytest.mark.integration


def readme_block() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Run the router by hand") :]
    match = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert match is not None, "the README's by-hand section has no bash block"
    return match.group(1)


def test_readme_by_hand_example_works_as_written(tmp_path: Path) -> None:
    script = readme_block()
    ports = {p: str(free_port()) for p in ("9001", "9002", "8000")}
    for old, new in ports.items():
        assert old in script
        script = re.sub(rf"\b{old}\b", new, script)
    path = tmp_path / "by-hand.sh"
    path.write_text(f"set -e\ncd {tmp_path}\n{script}", encoding="utf-8")
    with proc_group(tmp_path) as group:
        env = {"PATH": f"{BIN}:/usr/bin:/bin"}
        proc: Proc = group.start("by-hand", ["bash", str(path)], env=env)
        deadline = time.monotonic() + 120
        while proc.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        out = proc.output()
        assert not proc.alive() and proc.popen.returncode == 0, out[-3000:]
        last = [line for line in out.splitlines() if line.startswith("{")][-1]
        doc = json.loads(last)
        assert doc["object"] == "text_completion" and doc["choices"][0]["text"], doc
        journal = tmp_path / "runs" / "journal.jsonl"  # written by the journal's own thread
        wait_for("the journal file", journal.exists)


def test_engines_not_serving_the_model_are_not_eligible_and_say_why(tmp_path: Path) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 2, model="sim-model")
        # the case: the fleet names another model than the engines were started with
        fleet = write_fleet(
            tmp_path, sims, model="narwhal/sim-1b", extra={**FAST, "engine": {"tokenize": True}}
        )
        router = start_router(group, fleet, tmp_path)
        want = (
            "no available engines (e0 serves ['sim-model'], expected narwhal/sim-1b; "
            "e1 serves ['sim-model'], expected narwhal/sim-1b)"
        )
        wait_for("/ready names the model problem", lambda: router.get("/ready").json()["reason"] == want)
        assert router.get("/ready").status_code == 503
        assert router.get("/health").json()["status"] != "ok"
        life = router.get("/narwhal/lifecycle").json()
        assert life["engines"]["e0"]["error"] == "serves ['sim-model'], expected narwhal/sim-1b"
        assert life["engines"]["e0"]["accepts_new"] is False
        state = router.get("/narwhal/state").json()
        assert (
            state["scheduler"]["engines"]["e1"]["excluded"] == "serves ['sim-model'], expected narwhal/sim-1b"
        )
        r = loopback.post(
            router.url + "/v1/completions", json={"model": "narwhal/sim-1b", "prompt": "x", "max_tokens": 2}
        )
        assert r.status_code == 503  # refused as not ready, never a 502 from the engine
        # the fleet sets engine.tokenize, which this router accepts without acting on: said once
        lines = [line for line in router.proc.output().splitlines() if "accepted, not used: " in line]
        assert len(lines) == 1 and str(fleet) in lines[0] and "engine.tokenize (" in lines[0], lines


def test_one_engine_with_the_wrong_model_is_held_out_until_it_serves_it(tmp_path: Path) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3, model="sim-model")
        set_fault(sims[2].url, wrong_model="other-model")
        fleet = write_fleet(tmp_path, sims, extra=FAST)
        router = start_router(group, fleet, tmp_path, wait_ready=True)
        state = router.get("/narwhal/state").json()
        assert state["scheduler"]["engines"]["e2"]["excluded"] == "serves ['other-model'], expected sim-model"
        assert "e2" not in state["scheduler"]["eligible"]
        assert router.get("/narwhal/lifecycle").json()["engines"]["e2"]["error"].startswith("serves ")
        for _ in range(6):
            r = loopback.post(
                router.url + "/v1/completions", json={"model": "sim-model", "prompt": "x", "max_tokens": 2}
            )
            assert r.status_code == 200
        reset_faults(sims[2].url)  # the next liveness sweep sees the model again
        wait_for(
            "e2 eligible again",
            lambda: "e2" in router.get("/narwhal/state").json()["scheduler"]["eligible"],
        )
        assert router.get("/narwhal/lifecycle").json()["engines"]["e2"]["error"] == ""
        wait_for(
            "exclusion and its end journaled",
            lambda: (
                {"engine_excluded", "engine_exclusion_ended"}
                <= {r.get("event") for r in router.journal_rows()}
            ),
        )
