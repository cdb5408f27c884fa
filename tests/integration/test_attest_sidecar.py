"""``narwhal-attest`` in front of engines that do not attest themselves (like stock vLLM).

Simulated engines run with ``--no-attestation`` under a real supervisor; each has a real sidecar
process (e0 bound by ``/metrics`` only, e1 also by ``--engine-pid``). The router's readmission
check goes through the sidecars: drain → restart → re-bound sidecar → readmit passes; a process
the sidecar did not bind, or a sidecar attesting a foreign contract, is refused with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleet.contract import DEFAULT_CONTRACT
from router.attestation import contract_fingerprint
from tests.support import loopback
from tests.support.attest import Sidecar, engine_pids, restart_sidecar, start_sidecar, write_contract
from tests.support.fleet import process_start, start_sims, start_supervisor, write_fleet
from tests.support.lifecycle import FAST, Stack, wait_for
from tests.support.procs import proc_group
from tests.support.router import start_router

pytestmark = pytest.mark.integration


def _drained(s: Stack, iid: str) -> None:
    status, doc = s.post("drain", {"engines": [iid], "deadline_s": 30})
    assert status == 200, doc
    wait_for(f"{iid} ready_to_stop", lambda: s.lifecycle()["engines"][iid]["ready_to_stop"])


def test_readmission_through_the_sidecar(tmp_path: Path) -> None:
    contract = write_contract(tmp_path / "contract.json", dict(DEFAULT_CONTRACT))
    foreign = write_contract(
        tmp_path / "foreign.json", {**DEFAULT_CONTRACT, "image_digest": "sha256:" + "f" * 64}
    )
    label = f"attestation {contract_fingerprint(DEFAULT_CONTRACT)}"
    with proc_group(tmp_path) as group:
        sup, sims = start_supervisor(group, tmp_path, 2, no_attestation=True)
        assert loopback.get(sims[0].url + "/v1/attestation", timeout=5).status_code == 404
        pids = engine_pids(sup)
        sides = {
            "e0": start_sidecar(group, "e0", sims[0].url, contract),
            "e1": start_sidecar(group, "e1", sims[1].url, contract, pid=pids["e1"]),
        }
        fleet_path = write_fleet(tmp_path, sims, extra=FAST)
        doc: dict[str, Any] = json.loads(fleet_path.read_text())
        for engine in doc["engines"]:
            engine["attestation_url"] = sides[engine["iid"]].attestation_url
        fleet_path.write_text(json.dumps(doc))
        router = start_router(group, fleet_path, tmp_path, wait_ready=True)
        s = Stack(router, sup, sims)

        # what the sidecar serves is bound to the live process
        att = loopback.get(sides["e1"].attestation_url, timeout=5).json()
        assert att["schema"] == "narwhal.attestation" and att["contract"] == DEFAULT_CONTRACT
        assert att["engine"]["process_start_time_seconds"] == process_start(sims[1].url)
        assert att["launch"]["models"] == ["sim-model"] and "--no-attestation" in att["launch"]["args"]
        proc_doc = loopback.get(sides["e1"].url + "/v1/process", timeout=5).json()
        assert proc_doc["pid"] == pids["e1"] and proc_doc["source"] == "proc"

        # 1. drain → restart → re-bound sidecar → readmit passes the attestation check
        _drained(s, "e0")
        s.restart("e0")
        sides["e0"] = restart_sidecar(group, sides["e0"], contract)
        status, out = s.post("readmit", {"engines": ["e0"]})
        assert status == 200, out["engines"]["e0"]
        assert label in out["engines"]["e0"]["checks"]

        # 2. the engine restarted, its sidecar did not re-bind: the PID it bound exited → refused
        _drained(s, "e1")
        s.restart("e1")
        health = sides["e1"].health()
        assert health.status_code == 503 and health.json()["status"] == "changed"
        assert f"PID {pids['e1']}" in health.json()["error"]["message"]
        status, out = s.post("readmit", {"engines": ["e1"]})
        assert status == 409 and out["engines"]["e1"]["state"] == "blocked"
        error = out["engines"]["e1"]["error"]
        assert error.startswith("attestation unreadable: EngineAnswerError: attestation answered HTTP 503: ")
        assert "exited" in error, error
        assert out["engines"]["e1"]["accepts_new"] is False
        # the runbook's repair: start the sidecar for the new process, repeat the readmit
        sides["e1"] = restart_sidecar(group, sides["e1"], contract, pid=engine_pids(sup)["e1"])
        status, out = s.post("readmit", {"engines": ["e1"]})
        assert status == 200, out["engines"]["e1"]
        assert label in out["engines"]["e1"]["checks"]

        # 3. a sidecar attesting a foreign contract is refused, naming the field
        _drained(s, "e0")
        s.restart("e0")
        sides["e0"] = restart_sidecar(group, sides["e0"], foreign)
        status, out = s.post("readmit", {"engines": ["e0"]})
        assert status == 409
        assert "attestation: contract field image_digest is 'sha256:fff" in out["engines"]["e0"]["error"]
        sides["e0"] = restart_sidecar(group, sides["e0"], contract)
        status, out = s.post("readmit", {"engines": ["e0"]})
        assert status == 200, out["engines"]["e0"]

        # a sidecar left bound to an old process: the engine's /metrics start moved on → 503
        s.restart("e0")
        health = sides["e0"].health()
        assert health.status_code == 503 and "engine process changed" in health.json()["error"]["message"]
        assert loopback.get(sides["e0"].attestation_url, timeout=5).status_code == 503  # never stale


def test_bad_input_exits_2_with_a_message(tmp_path: Path) -> None:
    import subprocess

    from tests.support.procs import script

    gone = subprocess.Popen(["true"])
    gone.wait()
    contract = write_contract(tmp_path / "c.json", dict(DEFAULT_CONTRACT))
    cases = [
        (["--engine-pid", str(gone.pid), "--contract", str(contract)], f"no process with PID {gone.pid}"),
        (["--contract", str(tmp_path / "missing.json")], "cannot read contract file"),
        (["--contract", str(write_contract(tmp_path / "i.json", {"engine_version": "x"}))], "incomplete"),
    ]
    for args, needle in cases:
        proc = subprocess.run(
            [script("narwhal-attest"), "--engine-url", "http://127.0.0.1:1", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, proc.stderr
        assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_pid_that_does_not_serve_the_engines_port_is_refused(tmp_path: Path) -> None:
    """``--engine-pid`` naming another engine (started a moment later: its start is well within
    ``--max-start-skew`` of the engine's own) or a process with no socket at all is never bound:
    503 ``unbound`` saying the PID holds no socket listening on the engine URL's port. The engine's
    own PID binds and its command line is what is attested."""
    contract = write_contract(tmp_path / "contract.json", dict(DEFAULT_CONTRACT))
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 2, no_attestation=True)
        pids = [s.proc.pid for s in sims if s.proc is not None]
        idle = group.start("idle", ["sleep", "300"])
        for wrong in (pids[1], idle.pid):
            side = start_sidecar(group, f"wrong-{wrong}", sims[0].url, contract, pid=wrong, wait_bound=False)

            def refusal(side: Sidecar = side) -> dict[str, Any] | None:
                try:
                    r = side.health()
                except httpx.TransportError:  # not listening yet
                    return None
                doc: dict[str, Any] = r.json()
                return doc if r.status_code == 503 and "listening" in doc["error"]["message"] else None

            doc = wait_for(f"the sidecar given PID {wrong} refusing it", refusal)
            assert doc["status"] == "unbound"
            assert doc["error"]["message"] == (
                f"not bound: PID {wrong} holds no socket listening on port {sims[0].port} "
                "(the engine URL's port): --engine-pid does not name the engine process"
            )
            assert loopback.get(side.attestation_url, timeout=5).status_code == 503
            side.proc.stop()
        idle.stop()
        side = start_sidecar(group, "right", sims[0].url, contract, pid=pids[0])
        att = loopback.get(side.attestation_url, timeout=5).json()
        args = att["launch"]["args"]
        assert "--no-attestation" in args and args[args.index("--port") + 1] == str(sims[0].port)
