"""narwhal-supervisor as a real process owning real simulated engines."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import loopback
from tests.support.fleet import SimEngine, process_start, set_fault, start_supervisor
from tests.support.procs import ProcGroup, proc_group

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def supervised(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[SimEngine]]]:
    tmp = tmp_path_factory.mktemp("supervisor")
    group = ProcGroup(tmp)
    try:
        yield start_supervisor(group, tmp, 2)
    finally:
        group.close()


def engines(url: str) -> dict[str, Any]:
    doc: dict[str, Any] = loopback.get(url + "/engines", timeout=10).json()["engines"]
    return doc


def restart(url: str, iid: str, body: dict[str, Any] | None = None) -> httpx.Response:
    return loopback.post(f"{url}/engines/{iid}/restart", json=body, timeout=60)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_engines_listing(supervised: tuple[str, list[SimEngine]]) -> None:
    url, sims = supervised
    assert loopback.get(url + "/health").json() == {"status": "ok"}
    doc = engines(url)
    assert sorted(doc) == ["e0", "e1"]
    for sim in sims:
        entry = doc[sim.iid]
        assert entry["running"] is True and entry["url"] == sim.url and isinstance(entry["pid"], int)
        assert entry["process_start"] == process_start(sim.url)
    r = restart(url, "nope")
    assert r.status_code == 404 and r.json() == {"error": "unknown engine: nope"}


def test_restart_gives_new_process_and_guard_is_idempotent(supervised: tuple[str, list[SimEngine]]) -> None:
    url, sims = supervised
    before = engines(url)["e0"]
    r = restart(url, "e0", {"if_process_start": before["process_start"]})
    assert r.status_code == 200, r.text
    res = r.json()
    assert res["restarted"] is True and res["old_pid"] == before["pid"] and res["new_pid"] != before["pid"]
    assert res["old_process_start"] == before["process_start"]
    assert res["new_process_start"] > before["process_start"]
    assert process_start(sims[0].url) == res["new_process_start"]
    assert loopback.get(sims[0].url + "/health").status_code == 200
    # the same guarded request again (a retried activity) does not restart a second time
    again = restart(url, "e0", {"if_process_start": before["process_start"]}).json()
    assert again["restarted"] is False and again["pid"] == res["new_pid"]
    after = engines(url)["e0"]
    assert after["pid"] == res["new_pid"] and after["restarts"] == before["restarts"] + 1


def test_concurrent_guarded_restarts_restart_once(supervised: tuple[str, list[SimEngine]]) -> None:
    url, _ = supervised
    start = engines(url)["e1"]["process_start"]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: restart(url, "e1", {"if_process_start": start}).json(), range(2)))
    assert sorted(r["restarted"] for r in results) == [False, True]


def test_stop_and_start_are_idempotent(supervised: tuple[str, list[SimEngine]]) -> None:
    url, sims = supervised
    stopped = loopback.post(url + "/engines/e1/stop", timeout=30).json()
    assert stopped["stopped"] is True and not pid_alive(stopped["pid"])
    assert loopback.post(url + "/engines/e1/stop", timeout=30).json()["stopped"] is False
    entry = engines(url)["e1"]
    assert (entry["running"], entry["pid"], entry["process_start"]) == (False, None, None)
    started = loopback.post(url + "/engines/e1/start", timeout=60).json()
    assert started["started"] is True
    assert loopback.post(url + "/engines/e1/start", timeout=60).json()["started"] is False
    assert loopback.get(sims[1].url + "/health").status_code == 200


def test_sigterm_stops_every_engine(tmp_path: Path) -> None:
    with proc_group(tmp_path) as group:
        url, _ = start_supervisor(group, tmp_path, 2)
        pids = [e["pid"] for e in engines(url).values()]
        assert all(pid_alive(p) for p in pids)
        assert group.procs[0].stop() == 0
        deadline = time.monotonic() + 10
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(pid_alive(p) for p in pids)


def test_guarded_restart_of_a_hung_engine(supervised: tuple[str, list[SimEngine]]) -> None:
    url, sims = supervised
    before = engines(url)["e0"]
    set_fault(sims[0].url, hang=True)  # /metrics no longer answers: the recorded identity is used
    res = restart(url, "e0", {"if_process_start": before["process_start"]}).json()
    assert res["restarted"] is True and res["old_process_start"] == before["process_start"]
    assert loopback.get(sims[0].url + "/health", timeout=5).status_code == 200  # fresh process, no faults
