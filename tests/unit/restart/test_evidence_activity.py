"""``sample_evidence`` against ``httpx.MockTransport`` routers: every router read, each replica's own
counters kept apart (the analysis sums them), a router that cannot be read named, none → retryable."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.evidence import EvidenceActivities
from activities.router import LifecycleClient
from activities.worker_config import RouterEntry, WorkerConfig, WorkerSettings
from narwhal_models.restart import RouterRef
from router.engine_stats import EngineStats
from workflows.analysis import window

URLS = ["http://a:1", "http://b:2", "http://c:3", "http://d:4"]


def state(run: str, served: int) -> dict[str, Any]:
    st = EngineStats(["e0", "e1"])
    for _ in range(served):
        st.prefill_served("e0", 0.02)
    st.leg_failed("e0", "prefill", "engine_error")
    evidence = {k: v.model_dump(mode="json") for k, v in st.snapshot().items()}
    return {"schema": "narwhal.state", "run": run, "engine_evidence": evidence, "other": "ignored"}


def acts(routes: dict[str, Any], env: dict[str, str] | None = None) -> EvidenceActivities:
    def handle(req: httpx.Request) -> httpx.Response:
        key = f"{req.url.scheme}://{req.url.host}:{req.url.port}"
        answer = routes[key]
        if isinstance(answer, Exception):
            raise answer
        assert req.headers.get("authorization") == ("Bearer t" if env else None)
        return httpx.Response(answer[0], json=answer[1])

    entry = RouterEntry(urls=URLS, token_env="TOK" if env else "")
    settings = WorkerSettings.of(WorkerConfig(routers={"r": entry}))
    http = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    return EvidenceActivities(LifecycleClient(http, settings, env=env or {}))


async def test_every_replica_is_read_and_the_window_sums_them() -> None:
    ref = RouterRef(name="r")
    routes: dict[str, Any] = {
        "http://a:1": (200, state("ra", 5)),
        "http://b:2": (200, state("rb", 7)),
        "http://c:3": httpx.ConnectError("refused"),
        "http://d:4": (200, {"schema": "narwhal.state", "run": "old"}),  # a router without evidence
    }
    a = acts(routes, {"TOK": "t"})
    first = await ActivityEnvironment().run(a.sample_evidence, ref)
    assert sorted(first.routers) == ["http://a:1", "http://b:2"]
    assert first.unreachable["http://c:3"] == "ConnectError"
    assert "engine_evidence" in first.unreachable["http://d:4"]
    routes["http://a:1"], routes["http://b:2"] = (200, state("ra", 15)), (200, state("rb", 9))
    second = await ActivityEnvironment().run(a.sample_evidence, ref)
    w = window(first, second)
    assert w.engines["e0"].prefill.served == 10 + 2 and w.engines["e0"].prefill.failed == {}
    assert set(w.left_out) == {"http://c:3", "http://d:4"}


async def test_no_router_answering_is_a_retryable_router_unavailable() -> None:
    a = acts({u: (503, {"error": "down"}) for u in URLS})
    with pytest.raises(ApplicationError) as exc:
        await ActivityEnvironment().run(a.sample_evidence, RouterRef(name="r"))
    assert not exc.value.non_retryable and "http://a:1: HTTP 503" in str(exc.value)
