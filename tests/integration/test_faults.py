"""Engine faults through a real router: client status + counter per fault mode, breaker outcome,
readmission after recovery, and the last engine of a role never ejected."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.serving_support import contract_free_fleet, terminal_sum, wait_until
from tests.support import loopback
from tests.support.fleet import SimEngine, reset_faults, restart_sim, set_fault, start_sims
from tests.support.procs import ProcGroup, proc_group
from tests.support.router import RouterHandle, start_router

pytestmark = pytest.mark.integration
MODEL = "sim-model"
BODY = {"model": MODEL, "prompt": "hello fleet", "max_tokens": 4}


def ejected(router: RouterHandle, iid: str) -> bool:
    return router.metrics()[f'narwhal_engine_ejected{{iid="{iid}"}}'] == 1


def events(router: RouterHandle, name: str, iid: str) -> list[dict[str, Any]]:
    """The journal's ``name`` rows for ``iid``, once there is one (the writer thread is behind by a
    batch at most)."""
    rows: list[dict[str, Any]] = wait_until(
        lambda: [r for r in router.journal_rows() if r.get("event") == name and r.get("iid") == iid],
        what=f"journal {name} {iid}",
    )
    return rows


# -- one attempt, two engines: the client sees each fault's own status -------------------------
@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RouterHandle, list[SimEngine]]]:
    tmp = tmp_path_factory.mktemp("faults1")
    with proc_group(tmp) as group:
        sims = start_sims(group, 2, roles=["prefill", "decode"])
        fleet = contract_free_fleet(tmp, sims, max_attempts=1)
        yield start_router(group, fleet, tmp, wait_ready=True), sims


CASES = [
    # (engine index, fault, status, error type, failed reason)
    (1, {"error_rate": 1.0}, 502, "decode", "engine_error"),
    (0, {"error_rate": 1.0}, 502, "prefill", "engine_error"),
    (0, {"break_descriptor": True}, 502, "prefill", "invalid_response"),
    (0, {"break_descriptor": "garbled"}, 502, "prefill", "invalid_response"),
    (1, {"kv_layout": "other-layout"}, 502, "decode", "engine_rejected"),
    (1, {"hang": True}, 504, "decode", "engine_timeout"),
    (0, {"slow_ms": 3000.0}, 504, "prefill", "engine_timeout"),
    (1, {"generation_fail": True}, 502, "decode", "invalid_response"),
    (1, {"wrong_model": "other"}, 502, "decode", "engine_rejected"),
]


@pytest.mark.parametrize(("idx", "fault", "status", "type_", "reason"), CASES)
def test_fault_mode_client_status_and_counter(
    single: tuple[RouterHandle, list[SimEngine]],
    idx: int,
    fault: dict[str, Any],
    status: int,
    type_: str,
    reason: str,
) -> None:
    router, sims = single
    m0 = router.metrics()
    set_fault(sims[idx].url, **fault)
    try:
        r = router.post("/v1/completions", BODY)
    finally:
        reset_faults(sims[idx].url)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert (err["type"], err["code"]) == (type_, reason)
    assert r.headers["x-request-id"]
    m1 = router.metrics()
    key = f'narwhal_failed_total{{reason="{reason}"}}'
    assert m1[key] - m0[key] == 1
    assert m1["narwhal_offered_total"] - m0["narwhal_offered_total"] == 1
    assert router.post("/v1/completions", BODY).status_code == 200  # success evidence clears the streak
    assert not ejected(router, "e0") and not ejected(router, "e1")


def test_stream_failure_after_output_ends_with_error_event(
    single: tuple[RouterHandle, list[SimEngine]],
) -> None:
    router, sims = single
    body = {**BODY, "max_tokens": 400, "stream": True}
    set_fault(sims[1].url, slow_ms=5.0)
    try:
        with (
            loopback.client(timeout=10) as client,
            client.stream("POST", router.url + "/v1/completions", json=body) as r,
        ):
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            set_fault(sims[1].url, hang=True)  # silence mid-stream → decode read timeout
            rest = [line for line in lines if line]
    finally:
        reset_faults(sims[1].url)
    assert rest[-1].startswith('data: {"error"') and "[DONE]" not in rest[-1]
    m = router.metrics()
    assert m["narwhal_offered_total"] == terminal_sum(m)


def test_last_engine_of_a_role_is_never_ejected(single: tuple[RouterHandle, list[SimEngine]]) -> None:
    router, sims = single
    for s in sims:
        set_fault(s.url, error_rate=1.0)
    try:
        for _ in range(12):
            assert router.post("/v1/completions", BODY).status_code == 502
        wait_until(lambda: sum(ejected(router, s.iid) for s in sims) == 1, what="one ejection")
        m = wait_until(
            lambda: (
                (mm := router.metrics())
                and any(
                    k.startswith("narwhal_engine_ejections_spared_total") and v >= 1 for k, v in mm.items()
                )
                and mm
            ),
            what="a spared ejection",
        )
        assert sum(m[f'narwhal_engine_ejected{{iid="{s.iid}"}}'] for s in sims) == 1
        assert router.get("/ready").status_code == 200  # one engine still serves both roles
    finally:
        for s in sims:
            reset_faults(s.url)
    wait_until(lambda: not any(ejected(router, s.iid) for s in sims), what="readmission")
    assert router.post("/v1/completions", BODY).status_code == 200


# -- retries on, three engines: breaker ejections and readmission -----------------------------
@pytest.fixture(scope="module")
def trio(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[RouterHandle, list[SimEngine], ProcGroup]]:
    tmp = tmp_path_factory.mktemp("faults3")
    with proc_group(tmp) as group:
        sims = start_sims(group, 3, roles=["prefill", "decode", "decode"])
        yield start_router(group, contract_free_fleet(tmp, sims), tmp, wait_ready=True), sims, group


def _until_ejected(router: RouterHandle, iid: str, n: int = 12) -> list[int]:
    statuses = []
    for _ in range(n):
        statuses.append(router.post("/v1/completions", BODY).status_code)
        if ejected(router, iid):
            break
    wait_until(lambda: ejected(router, iid), what=f"{iid} ejected")
    return statuses


def test_inference_errors_eject_after_probe_and_readmit(
    trio: tuple[RouterHandle, list[SimEngine], ProcGroup],
) -> None:
    router, sims, _ = trio
    set_fault(sims[1].url, error_rate=1.0)
    statuses = _until_ejected(router, "e1")
    assert set(statuses) == {200}  # every failed first attempt was retried on another engine
    m = router.metrics()
    assert m['narwhal_engine_ejections_total{iid="e1",cause="inference_probe"}'] == 1
    assert router.post("/v1/completions", BODY).status_code == 200
    reset_faults(sims[1].url)
    wait_until(lambda: not ejected(router, "e1"), what="e1 readmitted")
    assert router.metrics()['narwhal_engine_readmissions_total{iid="e1"}'] >= 1
    assert events(router, "engine_ejected", "e1")[-1]["cause"] == "inference_probe"
    assert events(router, "engine_readmitted", "e1")[-1]["evidence"] == "health"


def test_prefill_timeouts_health_probe_then_eject(
    trio: tuple[RouterHandle, list[SimEngine], ProcGroup],
) -> None:
    router, sims, _ = trio
    set_fault(sims[0].url, hang=True)  # prefill times out, /health hangs too
    try:
        statuses = _until_ejected(router, "e0")
        assert set(statuses) == {200}
        assert router.metrics()['narwhal_engine_ejections_total{iid="e0",cause="health_probe"}'] == 1
        assert router.post("/v1/completions", BODY).status_code == 200  # prefill moved to another engine
    finally:
        reset_faults(sims[0].url)
    wait_until(lambda: not ejected(router, "e0"), what="e0 readmitted")


def test_dead_engine_ejected_for_connection_and_readmitted_after_restart(
    trio: tuple[RouterHandle, list[SimEngine], ProcGroup],
) -> None:
    router, sims, group = trio
    assert sims[1].proc is not None
    sims[1].proc.stop()
    statuses = _until_ejected(router, "e1")
    assert set(statuses) == {200}
    assert router.metrics()['narwhal_engine_ejections_total{iid="e1",cause="connection"}'] == 1
    restart_sim(group, sims[1])
    wait_until(lambda: not ejected(router, "e1"), what="e1 readmitted after restart")
    m = router.metrics()
    assert m["narwhal_offered_total"] == terminal_sum(m)
    assert router.get("/ready").status_code == 200
