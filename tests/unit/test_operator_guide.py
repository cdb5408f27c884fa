"""The operator guide's shell runs as written: every jq expression in docs/operator-guide.md, run
with the real ``jq`` (Debian 12 ships jq 1.6) against lifecycle documents — one captured from this
router's own document builder after a drain, one captured from the peer — and the restart one-liner
and the ``until`` loop of section 2 with ``curl`` answering from the captured document."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from router.core import RouterCore
from router.journal import Journal
from router.lifecycle.document import build_document
from router.lifecycle.machine import LifecycleMachine
from tests.unit.lifecycle.helpers import fleet

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "operator-guide.md"
PEER_DRAIN = REPO / "tests" / "fixtures" / "peer_examples" / "drain_e0.json"
OLD_START = 1795966339.9004564
JQ_CALL = re.compile(r"\bjq((?:\s+-[a-z]+)*)\s+'([^']*)'")
FENCE = re.compile(r"```bash\n(.*?)```", re.S)


def _jq() -> str:
    path = shutil.which("jq")
    assert path, "jq is not installed: scripts/bootstrap.sh (or .ci/run) installs it with apt-get"
    return path


def _ours() -> dict[str, Any]:
    cfg = fleet(3)
    core = RouterCore(config=cfg, journal=Journal(None))
    machine = LifecycleMachine(cfg, core.scheduler, core.clock)
    machine.begin(["e0"], wave=False, deadline_s=300)
    machine.record_old_identity("e0", OLD_START)
    doc = build_document(machine, core).to_json()
    assert doc["engines"]["e0"]["state"] == "drained" and doc["engines"]["e0"]["ready_to_stop"]
    return doc


def _peer() -> dict[str, Any]:
    body: dict[str, Any] = json.loads(PEER_DRAIN.read_text())["body"]
    return body


DOCUMENTS = {"ours": _ours, "peer": _peer}


def _calls() -> list[tuple[list[str], str]]:
    found = [(flags.split(), expr) for flags, expr in JQ_CALL.findall(GUIDE.read_text())]
    assert len(found) >= 4, found  # the guide's wait loop, status line, restart body and repair read
    return found


def _blocks(marker: str) -> str:
    blocks = [b for b in FENCE.findall(GUIDE.read_text()) if marker in b]
    assert len(blocks) == 1, f"expected one bash block containing {marker!r}, found {len(blocks)}"
    return blocks[0]


@pytest.mark.parametrize("which", sorted(DOCUMENTS))
def test_every_jq_expression_in_the_guide_runs_on_a_captured_document(which: str) -> None:
    doc = json.dumps(DOCUMENTS[which]())
    for flags, expr in _calls():
        run = subprocess.run(
            [_jq(), *flags, expr], input=doc, capture_output=True, text=True, timeout=30, check=False
        )
        assert run.returncode == 0, f"jq {' '.join(flags)} '{expr}' failed: {run.stderr.strip()}"
        assert run.stdout.strip() not in ("", "null"), f"jq '{expr}' printed {run.stdout!r}"


def _fake_curl(doc_path: Path, posts: Path) -> str:
    """A ``curl`` shell function: GETs answer with the captured document, POST bodies are recorded."""
    return f"""
curl() {{
  local body="" post=0
  while [ $# -gt 0 ]; do
    case "$1" in -X) [ "$2" = POST ] && post=1; shift ;; -d) body="$2"; shift ;; esac
    shift
  done
  if [ "$post" = 1 ]; then printf '%s\\n' "$body" >> {posts}; else cat {doc_path}; fi
}}
sleep() {{ echo "slept: the loop did not end" >&2; exit 7; }}
R=http://router.invalid R2=http://router2.invalid SUP=http://supervisor.invalid AUTH=()
"""


@pytest.mark.parametrize("which", sorted(DOCUMENTS))
def test_restart_one_liner_sends_the_recorded_process_start(which: str, tmp_path: Path) -> None:
    doc_path, posts = tmp_path / "lifecycle.json", tmp_path / "posts.jsonl"
    doc_path.write_text(json.dumps(DOCUMENTS[which]()))
    script = _fake_curl(doc_path, posts) + _blocks("if_process_start")
    run = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30, check=False)
    assert run.returncode == 0, run.stderr
    sent = [json.loads(line) for line in posts.read_text().splitlines()]
    assert sent == [{"if_process_start": OLD_START}]


@pytest.mark.parametrize("which", sorted(DOCUMENTS))
def test_wait_loop_ends_once_ready_to_stop(which: str, tmp_path: Path) -> None:
    doc_path, posts = tmp_path / "lifecycle.json", tmp_path / "posts.jsonl"
    doc_path.write_text(json.dumps(DOCUMENTS[which]()))
    script = _fake_curl(doc_path, posts) + _blocks("until curl")
    run = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30, check=False)
    assert run.returncode == 0, run.stderr  # a broken expression never ends the loop (sleep exits 7)


def test_wait_loop_keeps_waiting_while_draining(tmp_path: Path) -> None:
    doc = _ours()
    doc["engines"]["e0"].update(ready_to_stop=False, state="draining")
    doc_path, posts = tmp_path / "lifecycle.json", tmp_path / "posts.jsonl"
    doc_path.write_text(json.dumps(doc))
    script = _fake_curl(doc_path, posts) + _blocks("until curl")
    run = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30, check=False)
    assert run.returncode == 7 and '"state":"draining"' in run.stdout  # printed the status, then slept


@pytest.mark.parametrize("state", ["active", "blocked"])
def test_wait_loop_ends_when_nothing_is_draining(state: str, tmp_path: Path) -> None:
    """A refused drain (engine still active) or a blocked engine: the loop says so and ends."""
    doc = _ours()
    doc["engines"]["e0"].update(ready_to_stop=False, state=state)
    doc_path, posts = tmp_path / "lifecycle.json", tmp_path / "posts.jsonl"
    doc_path.write_text(json.dumps(doc))
    script = _fake_curl(doc_path, posts) + _blocks("until curl")
    run = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30, check=False)
    assert run.returncode == 0 and "e0 is not draining" in run.stderr and "slept" not in run.stderr
