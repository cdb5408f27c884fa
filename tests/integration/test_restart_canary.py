"""Restart waves that judge what they restarted: canary analysis on live traffic, end to end.

One stack for the module (Temporal dev server, the session's ``narwhal-worker``, a router, four
simulated engines under the local supervisor, client load). The supervisor knows three other
builds of the simulator: ``next`` (a good one), ``failing`` (20 % of requests answer 500) and
``slow`` (3× the time to first token). A test stages a build, starts a rolling restart with
``--analysis`` and reads what the run, the router and the supervisor say; a held engine is put
back on the old build before the next test. A failing build with a rollback template ends with
its first engine back on the previous build, readmitted.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle

from narwhal_models.evidence import AnalysisPolicy
from narwhal_models.restart import RestartProgress, RestartResult, fleet_workflow_id
from tests.integration.conftest import Temporal
from tests.integration.restart_support import (
    cli,
    engine_state,
    lifecycle,
    new_fleet,
    plan,
    progress,
    start,
    supervisor_restarts,
    until,
    worker_routers,
)
from tests.support import loopback
from tests.support.lifecycle import Stack, client_load, start_stack, wait_for
from tests.support.procs import proc_group
from tests.support.worker_config import session_worker_config
from workflows.outcome import failure_line

pytestmark = pytest.mark.integration

BUILDS = {
    "next": {"version": "0.11.1"},
    # seed 56: the first draws succeed (the readmission checks pass, as a subtly bad build's would),
    # then a fifth of the requests fail
    "failing": {"version": "0.12.0-failing", "error_rate": 0.2, "seed": 56},
    "slow": {"version": "0.12.0-slow", "ttft_base_ms": 90},
}
POLICY = AnalysisPolicy(
    bake_s=1.0,
    interval_s=3.0,
    samples=2,
    min_requests=12,
    max_failure_rate_margin=0.02,
    percentile=0.9,
    max_ttft_ratio=1.8,
    max_tpot_ratio=2.0,
    failure_limit=1,
    inconclusive_limit=3,
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("canary")
    with proc_group(tmp) as group:
        yield start_stack(group, tmp, n=4, ttft_base_ms=30, builds=BUILDS)


def stage(s: Stack, build: str, iids: list[str]) -> None:
    for iid in iids:
        r = loopback.post(f"{s.supervisor}/engines/{iid}/build", json={"build": build}, timeout=10)
        assert r.status_code == 200, r.text


def builds(s: Stack) -> dict[str, Any]:
    body = loopback.get(f"{s.supervisor}/engines", timeout=10).json()
    return {iid: e["build"] for iid, e in body["engines"].items()}


def restore(s: Stack, iid: str) -> None:
    """Put a held engine back on the configured build and into service through the lifecycle."""
    stage(s, "", [e.iid for e in s.sims])
    s.restart(iid)
    status, doc = s.post("readmit", {"engines": [iid]})
    assert status == 200, doc
    wait_for(f"{iid} active", lambda: engine_state(s.router.url, iid) == "active")


async def finished(
    handle: WorkflowHandle[Any, Any],
) -> tuple[WorkflowExecutionStatus | None, RestartProgress]:
    """The run's Temporal status and its last progress document, once it has ended."""

    async def closed() -> Any:
        d = await handle.describe()
        return d if d.status != WorkflowExecutionStatus.RUNNING else None

    desc = await until("the run to end", closed, within=240)
    return desc.status, await progress(handle)


async def current_details(handle: WorkflowHandle[Any, Any]) -> str:
    """What the Temporal UI shows as Current Details (the SDK's built-in metadata query)."""
    meta: Any = await handle.query("__temporal_workflow_metadata")
    return str(meta.get("currentDetails", "")) if isinstance(meta, dict) else str(meta.current_details)


def nsa(desc: Any) -> str:
    return str({k.name: v for k, v in desc.typed_search_attributes}.get("NarwhalState", ""))


async def test_a_good_build_rolls_through_with_every_analysis_passing(
    temporal: Temporal, worker_queue: str, stack: Stack
) -> None:
    s = stack
    fleet = new_fleet("good")
    stage(s, "next", ["e0", "e2"])
    try:
        with client_load(s.router.url) as load:
            wait_for("client traffic", lambda: load.ok >= 10)
            handle = await start(
                temporal,
                worker_queue,
                plan(fleet, [s.router.url], s.supervisor, engines=["e0", "e2"], analysis=POLICY),
            )
            res = await handle.result()
        assert res.ok and res.state == "done", res.message
        verdicts = {iid: [x.verdict for x in res.analysis if x.engines == [iid]] for iid in ("e0", "e2")}
        for iid, vs in verdicts.items():
            assert "fail" not in vs and vs.count("pass") == POLICY.samples, (iid, res.analysis)
        first = next(x for x in res.analysis if x.engines == ["e0"])
        assert first.baseline.engines == ["e1", "e2", "e3"]  # not restarted yet
        assert next(x for x in res.analysis if x.engines == ["e2"]).baseline.engines == ["e1", "e3"]
        assert builds(s)["e0"] == "next" and builds(s)["e2"] == "next"
        assert load.failed == [], load.failed[:3]
        # the evidence the analysis read: per engine and leg, in /metrics and /narwhal/state
        m = s.router.metrics()
        assert m['narwhal_engine_leg_served_total{engine="e0",leg="prefill"}'] > 0
        assert m['narwhal_engine_leg_served_total{engine="e2",leg="decode"}'] > 0
        assert m['narwhal_engine_tpot_seconds_count{engine="e2"}'] > 0
        ev = s.router.get("/narwhal/state").json()["engine_evidence"]
        assert sorted(ev) == ["e0", "e1", "e2", "e3"] and ev["e3"]["decode"]["tpot_s"]["count"] > 0
    finally:
        stage(s, "", ["e0", "e2"])


async def _bad_build_is_stopped_at_the_first_engine(
    temporal: Temporal, worker_queue: str, s: Stack, build: str, why: str
) -> RestartProgress:
    fleet = new_fleet(build)
    everyone = [e.iid for e in s.sims]
    restarts = supervisor_restarts(s.supervisor)
    stage(s, build, everyone)  # the new build is rolled to the whole fleet
    with client_load(s.router.url) as load:
        wait_for("client traffic", lambda: load.ok >= 10)
        handle = await start(
            temporal, worker_queue, plan(fleet, [s.router.url], s.supervisor, analysis=POLICY)
        )
        status, p = await finished(handle)
        served = load.ok
        wait_for("the fleet keeps serving after the halt", lambda: load.ok >= served + 10)
    desc = await handle.describe()
    assert status in (WorkflowExecutionStatus.COMPLETED, WorkflowExecutionStatus.FAILED)
    assert p.state == "analysis_failed" and nsa(desc) == "analysis_failed", (p.state, p.message)
    assert p.message.startswith("canary analysis failed, rollout stopped; e0 drained again"), p.message
    assert why in p.message
    # stopped at the first engine: only e0 was restarted (onto the bad build), the rest untouched
    after = supervisor_restarts(s.supervisor)
    assert after["e0"] == restarts["e0"] + 1
    assert all(after[i] == restarts[i] for i in everyone if i != "e0"), after
    assert builds(s)["e0"] == build and all(builds(s)[i] != build for i in everyone if i != "e0")
    assert p.engines["e0"].outcome == "failed" and why in p.engines["e0"].error
    # build identity: the mixed-version fleet, per engine, in the progress and the lifecycle document
    version = BUILDS[build]["version"]
    assert p.engines["e0"].build.startswith(f"{version} · launch sha256:"), p.engines["e0"].build
    others = [p.engines[i].build for i in everyone if i != "e0"]
    assert all(" · launch sha256:" in b and not b.startswith(version) for b in others), others
    docs = lifecycle(s.router.url)["engines"]
    assert docs["e0"]["build"]["version"] == version and docs["e1"]["build"]["version"] == "0.11.0"
    # another build, another attested document (the launch digest too when its arguments differ)
    assert docs["e0"]["build"]["attestation_digest"] != docs["e1"]["build"]["attestation_digest"]
    if build == "failing":
        assert docs["e0"]["build"]["launch_digest"] != docs["e1"]["build"]["launch_digest"]
    assert all(p.engines[i].step == "pending" for i in everyone if i != "e0")
    # held out of placement
    e0 = lifecycle(s.router.url)["engines"]["e0"]
    assert e0["accepts_new"] is False and e0["state"] in ("draining", "drained"), e0
    failing = [x for x in p.analysis if x.verdict == "fail"]
    assert [x.engines for x in failing] == [["e0"]] and failing[0].baseline.engines == ["e1", "e2", "e3"]
    # the UI: the samples as a table in Current Details
    details = await current_details(handle)
    assert "**Canary analysis** — restarted vs baseline" in details, details
    assert "| e0 vs e1, e2, e3 | **fail** |" in details, details
    print(json.dumps([x.model_dump(mode="json") for x in failing], indent=1)[:2000])
    print(f"client requests: {load.ok} served, {len(load.failed)} failed during the analysis")
    return p


async def test_a_build_failing_a_fifth_of_its_requests_is_held_and_the_run_fails(
    temporal: Temporal, worker_queue: str, stack: Stack
) -> None:
    try:
        p = await _bad_build_is_stopped_at_the_first_engine(
            temporal, worker_queue, stack, "failing", "failure rate"
        )
    finally:
        restore(stack, "e0")
    fail = next(x for x in p.analysis if x.verdict == "fail")
    assert fail.canary.failure_rate is not None and fail.canary.failure_rate > 0.02
    assert fail.canary.failed_by_reason.get("engine_error", 0) > 0 and fail.baseline.failed == 0
    ev = stack.router.get("/narwhal/state").json()["engine_evidence"]["e0"]["prefill"]
    assert ev["failed"].get("engine_error", 0) >= fail.canary.failed


async def test_a_build_with_three_times_the_ttft_is_held_and_the_run_fails(
    temporal: Temporal, worker_queue: str, stack: Stack
) -> None:
    try:
        p = await _bad_build_is_stopped_at_the_first_engine(
            temporal, worker_queue, stack, "slow", "prefill TTFT"
        )
    finally:
        restore(stack, "e0")
    fail = next(x for x in p.analysis if x.verdict == "fail")
    c, b = fail.canary.ttft_s["prefill"], fail.baseline.ttft_s["prefill"]
    assert c is not None and b is not None and c / b > POLICY.max_ttft_ratio
    assert fail.canary.failed == 0  # slow, not failing


async def test_no_traffic_is_inconclusive_and_the_operator_approves(
    temporal: Temporal, worker_queue: str, stack: Stack, tmp_path: Path
) -> None:
    s = stack
    fleet = new_fleet("quiet")
    wid = fleet_workflow_id(fleet)
    policy = tmp_path / "analysis.yaml"
    policy.write_text("bake_s: 0.2\ninterval_s: 1\nsamples: 2\nmin_requests: 5\ninconclusive_limit: 1\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("bake_s: -1\n")
    common = ["--router", s.router.url, "--supervisor-url", s.supervisor, "--fleet", fleet, "--engines", "e0"]
    common += worker_routers(common)
    refused = cli(temporal, "start", *common, "--analysis", str(bad), "--task-queue", worker_queue)
    assert refused.returncode == 2 and f"--analysis {bad}: bake_s:" in refused.stderr, refused.stderr
    r = cli(
        temporal,
        "start",
        *common,
        "--analysis",
        str(policy),
        "--task-queue",
        worker_queue,
        "--poll-interval",
        "0.2",
    )
    assert r.returncode == 0, r.stderr
    handle = temporal.client.get_workflow_handle(wid, result_type=RestartResult)

    async def asking() -> Any:
        d = await handle.describe()
        return d if nsa(d) == "waiting_operator" else None

    await until("the analysis to ask the operator", asking, within=120)
    p = await progress(handle)
    assert [x.verdict for x in p.analysis] == ["inconclusive", "inconclusive"]
    assert "too little traffic" in p.analysis[0].reasons[0]
    status = cli(temporal, "status", "--fleet", fleet)
    assert "build 0.11.0 · launch sha256:" in status.stdout, status.stdout
    assert "waiting operator" in status.stdout and "analysis sample 2 e0: inconclusive" in status.stdout, (
        status.stdout
    )
    ans = cli(temporal, "approve", "--fleet", fleet, "--reason", "quiet hour")
    assert ans.returncode == 0, ans.stderr
    res = await handle.result()
    assert res.ok and res.state == "done" and res.engines["e0"].outcome == "restarted"
    assert [ev.kind for ev in res.events] == ["waiting_for_operator", "approved"]


async def test_a_failing_build_is_rolled_back_to_the_previous_build_and_readmitted(
    temporal: Temporal, worker_queue: str, stack: Stack
) -> None:
    s = stack
    fleet = new_fleet("rollback")
    everyone = [e.iid for e in s.sims]
    restarts = supervisor_restarts(s.supervisor)
    # a plan naming a template the worker lacks is refused before anything is drained
    unknown = await start(
        temporal,
        worker_queue,
        plan(fleet, [s.router.url], s.supervisor, analysis=POLICY, rollback_template="no-such-rollback"),
    )
    with pytest.raises(WorkflowFailureError) as refused:
        await unknown.result()
    assert "'no-such-rollback' is not in this worker's configuration" in failure_line(refused.value)
    assert supervisor_restarts(s.supervisor) == restarts
    assert engine_state(s.router.url, "e0") == "active"
    script = Path(__file__).parents[1] / "support" / "rollback_build.py"
    name = session_worker_config().add_template(
        f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {s.supervisor} {{iid}}",
        name="rollback-sim",
    )
    stage(s, "failing", everyone)
    try:
        with client_load(s.router.url) as load:
            wait_for("client traffic", lambda: load.ok >= 10)
            handle = await start(
                temporal,
                worker_queue,
                plan(
                    new_fleet("rollback"),
                    [s.router.url],
                    s.supervisor,
                    analysis=POLICY,
                    rollback_template=name,
                ),
            )
            status, p = await finished(handle)
    finally:
        stage(s, "", everyone)
        if engine_state(s.router.url, "e0") != "active":
            restore(s, "e0")
    assert status == WorkflowExecutionStatus.FAILED and p.state == "analysis_failed", (status, p.message)
    assert "e0 rolled back (template rollback-sim) and readmitted on 0.11.0 · launch sha256:" in p.message, (
        p.message
    )
    assert "failure rate" in p.message and [x.engines for x in p.analysis if x.verdict == "fail"] == [["e0"]]
    # e0 ran the failing build once, then the rollback: back on the previous build, serving
    after = supervisor_restarts(s.supervisor)
    assert after["e0"] == restarts["e0"] + 2 and all(after[i] == restarts[i] for i in everyone if i != "e0")
    assert builds(s)["e0"] == builds(s)["e1"] != "failing"
    e0 = lifecycle(s.router.url)["engines"]["e0"]
    assert e0["state"] == "active" and e0["accepts_new"] is True, e0
    assert e0["build"]["version"] == "0.11.0" != BUILDS["failing"]["version"], e0["build"]
    assert p.engines["e0"].outcome == "failed" and "rolled back" in p.engines["e0"].note
    assert all(p.engines[i].step == "pending" for i in everyone if i != "e0")
