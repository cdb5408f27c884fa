"""narwhal-engine-sim as real processes: vLLM endpoints, NIXL-style PD hand-off, faults, stats."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson
import pytest

from fleet.contract import DEFAULT_CONTRACT
from router.attestation import verify_attestation
from tests.support import loopback
from tests.support.fleet import (
    SimEngine,
    process_start,
    reset_faults,
    restart_sim,
    set_fault,
    sim_stats,
    start_sims,
)
from tests.support.procs import ProcGroup

pytestmark = pytest.mark.integration
PROMPT = "The narwhal surfaced beside the ice floe"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ProcGroup, list[SimEngine]]]:
    group = ProcGroup(tmp_path_factory.mktemp("sims"))
    try:
        yield group, start_sims(group, 3, roles=["prefill", "decode", "prefill"])
    finally:
        group.close()


@pytest.fixture
def sims(fleet: tuple[ProcGroup, list[SimEngine]]) -> Iterator[list[SimEngine]]:
    yield fleet[1]
    for s in fleet[1]:
        if s.proc is not None and s.proc.alive():
            reset_faults(s.url)


def post(
    url: str, body: dict[str, Any], path: str = "/v1/completions", timeout: float = 10.0
) -> httpx.Response:
    return loopback.post(url + path, json={"model": "sim-model", **body}, timeout=timeout)


def prefill(url: str, prompt: str = PROMPT) -> dict[str, Any]:
    r = post(
        url,
        {
            "prompt": prompt,
            "max_tokens": 1,
            "stream": False,
            "kv_transfer_params": {"do_remote_decode": True},
        },
    )
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def stream_frames(r: httpx.Response) -> list[Any]:
    frames = [line.removeprefix("data: ") for line in r.text.splitlines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    return [orjson.loads(f) for f in frames[:-1]]


def decode(url: str, kv: Any, prompt: str = PROMPT, max_tokens: int = 5) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "return_token_ids": True}
    return post(url, {**body, "kv_transfer_params": kv})


def test_identity_endpoints(sims: list[SimEngine]) -> None:
    e0 = sims[0]
    health = loopback.get(e0.url + "/health")
    assert (health.status_code, health.content) == (200, b"")
    assert loopback.get(e0.url + "/version").json() == {"version": "0.11.0"}
    assert process_start(e0.url) == sim_stats(e0.url)["process_start"]
    assert [m["id"] for m in loopback.get(e0.url + "/v1/models").json()["data"]] == ["sim-model"]
    assert "vllm:num_requests_running" in loopback.get(e0.url + "/metrics").text


def test_pd_handoff_between_two_sims(sims: list[SimEngine]) -> None:
    producer, consumer = sims[0], sims[1]
    p0, c0 = sim_stats(producer.url), sim_stats(consumer.url)
    leg = prefill(producer.url)
    kv = leg["kv_transfer_params"]
    assert kv["do_remote_prefill"] is True and kv["do_remote_decode"] is False
    assert kv["remote_engine_id"] == p0["engine_id"] and kv["remote_engine_id"].startswith("e0-")
    assert kv["remote_port"] == producer.port and kv["kv_layout"] == "nixl-v1"
    assert kv["remote_block_ids"] and all(isinstance(b, int) for b in kv["remote_block_ids"])
    r = decode(consumer.url, kv)
    assert r.status_code == 200, r.text
    chunks = stream_frames(r)
    ids = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert len(ids) == 5 and chunks[-1]["choices"][0]["finish_reason"] == "length"
    # the decode output equals a plain (non-PD) completion of the same prompt, buffered
    plain = post(consumer.url, {"prompt": PROMPT, "max_tokens": 5, "return_token_ids": True}).json()
    assert plain["choices"][0]["token_ids"] == ids
    assert plain["choices"][0]["text"] == "".join(c["choices"][0]["text"] for c in chunks)
    assert plain["usage"]["completion_tokens"] == 5
    p1, c1 = sim_stats(producer.url), sim_stats(consumer.url)
    assert p1["requests"]["prefill"] == p0["requests"]["prefill"] + 1
    assert p1["kv_pulls_served"] == p0["kv_pulls_served"] + 1
    assert c1["requests"]["decode"] == c0["requests"]["decode"] + 1
    assert c1["kv_pulls_done"] == c0["kv_pulls_done"] + 1
    # blocks are handed over once: replaying the descriptor fails
    assert decode(consumer.url, kv).status_code == 500


def test_decode_rejects_incompatible_layout(sims: list[SimEngine]) -> None:
    producer, consumer = sims[0], sims[1]
    set_fault(producer.url, kv_layout="nixl-v2")
    kv = prefill(producer.url)["kv_transfer_params"]
    assert kv["kv_layout"] == "nixl-v2"
    failed = sim_stats(consumer.url)["kv_pulls_failed"]
    r = decode(consumer.url, kv)
    assert r.status_code == 400 and "incompatible KV layout" in r.json()["error"]["message"]
    # a descriptor stripped of its layout is still refused by the producer at pull time
    kv = prefill(producer.url)["kv_transfer_params"]
    r = decode(consumer.url, {k: v for k, v in kv.items() if k != "kv_layout"})
    assert r.status_code == 500 and "incompatible KV layout" in r.json()["error"]["message"]
    assert sim_stats(consumer.url)["kv_pulls_failed"] == failed + 2


def test_decode_rejects_restarted_and_dead_producer(fleet: tuple[ProcGroup, list[SimEngine]]) -> None:
    group, (_, consumer, producer) = fleet[0], fleet[1]
    stale = prefill(producer.url)["kv_transfer_params"]
    doomed = prefill(producer.url)["kv_transfer_params"]
    old_start = process_start(producer.url)
    restart_sim(group, producer)
    assert process_start(producer.url) > old_start
    r = decode(consumer.url, stale)
    assert r.status_code == 500 and "unknown engine id" in r.json()["error"]["message"]
    assert producer.proc is not None and producer.proc.stop() == 0  # graceful SIGTERM exit
    r = decode(consumer.url, doomed)
    assert r.status_code == 500 and "unreachable" in r.json()["error"]["message"]
    restart_sim(group, producer)


def test_fault_health_error_model_generation(sims: list[SimEngine]) -> None:
    url = sims[0].url
    set_fault(url, health_fail=True)
    assert loopback.get(url + "/health").status_code == 503
    set_fault(url, health_fail=False, error_rate=1.0)
    assert post(url, {"prompt": "x"}).status_code == 500
    assert sim_stats(url)["errors"] >= 1
    set_fault(url, error_rate=0.0, wrong_model="other-model")
    assert [m["id"] for m in loopback.get(url + "/v1/models").json()["data"]] == ["other-model"]
    r = post(url, {"prompt": "x"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
    set_fault(url, wrong_model=None, generation_fail=True)
    r = post(url, {"prompt": "narwhal lifecycle generation check", "max_tokens": 1})
    assert r.status_code == 200 and r.json()["choices"] == []
    assert loopback.get(url + "/sim/faults").json()["generation_fail"] is True
    bad = loopback.post(url + "/sim/faults", json={"error_rate": 3})
    assert bad.status_code == 400 and "error_rate" in bad.json()["error"]["message"]
    assert reset_faults(url)["generation_fail"] is False
    assert post(url, {"prompt": "x", "max_tokens": 1}).json()["choices"]


def test_fault_break_descriptor(sims: list[SimEngine]) -> None:
    producer, consumer = sims[0], sims[1]
    set_fault(producer.url, break_descriptor=True)
    assert prefill(producer.url)["kv_transfer_params"] is None
    set_fault(producer.url, break_descriptor="garbled")
    kv = prefill(producer.url)["kv_transfer_params"]
    r = decode(consumer.url, kv)
    assert r.status_code == 400 and "invalid kv_transfer_params" in r.json()["error"]["message"]


def test_fault_slow_and_hang(sims: list[SimEngine]) -> None:
    url = sims[0].url
    set_fault(url, slow_ms=100)
    t0 = time.monotonic()
    assert post(url, {"prompt": "x", "max_tokens": 3}).status_code == 200
    assert time.monotonic() - t0 >= 0.3  # 3 tokens x 100 ms added
    set_fault(url, slow_ms=0, hang=True)
    with pytest.raises(httpx.ReadTimeout):
        loopback.get(url + "/health", timeout=0.3)
    with pytest.raises(httpx.ReadTimeout):
        post(url, {"prompt": "x"}, timeout=0.3)
    assert sim_stats(url)["iid"] == "e0"  # control endpoints still answer
    set_fault(url, hang=False)
    assert loopback.get(url + "/health").status_code == 200


def test_stream_cancel_is_counted(sims: list[SimEngine]) -> None:
    url = sims[1].url
    before = sim_stats(url)["cancelled_streams"]
    body = {"model": "sim-model", "prompt": "long", "max_tokens": 2000, "stream": True}
    with loopback.stream("POST", url + "/v1/completions", json=body, timeout=10) as r:
        lines = r.iter_lines()
        got = [line for line, _ in zip(lines, range(6), strict=False) if line.startswith("data: ")]
        assert got
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stats = sim_stats(url)
        if stats["cancelled_streams"] > before and stats["active_streams"] == 0:
            break
        time.sleep(0.05)
    assert stats["cancelled_streams"] == before + 1 and stats["active_streams"] == 0


def test_chat_and_determinism(sims: list[SimEngine]) -> None:
    msgs = {"messages": [{"role": "user", "content": "hi narwhal"}], "max_tokens": 4}
    a = post(sims[0].url, msgs, "/v1/chat/completions").json()
    b = post(sims[1].url, msgs, "/v1/chat/completions").json()
    assert a["object"] == "chat.completion" and a["usage"]["completion_tokens"] == 4
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    r = post(
        sims[1].url,
        {**msgs, "stream": True, "return_token_ids": True, "stream_options": {"include_usage": True}},
        "/v1/chat/completions",
    )
    chunks = stream_frames(r)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == a["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    other = post(
        sims[0].url, {**msgs, "messages": [{"role": "user", "content": "bye"}]}, "/v1/chat/completions"
    )
    assert other.json()["choices"][0]["message"]["content"] != a["choices"][0]["message"]["content"]


def test_attestation_bound_to_live_process(sims: list[SimEngine]) -> None:
    url = sims[0].url
    version = loopback.get(url + "/version").json()["version"]
    start = process_start(url)
    doc = loopback.get(url + "/v1/attestation").json()
    assert verify_attestation(doc, DEFAULT_CONTRACT, version, start) == []
    assert "--kv-transfer-config" in doc["launch"]["args"]
    assert verify_attestation(doc, DEFAULT_CONTRACT, version, start + 1.0)  # another process
    set_fault(url, attestation="broken")
    broken = verify_attestation(
        loopback.get(url + "/v1/attestation").json(), DEFAULT_CONTRACT, version, start
    )
    assert "attestation_digest does not match the document" in broken
    set_fault(url, attestation="fail")
    assert loopback.get(url + "/v1/attestation").status_code == 503


def test_concurrency_limit_queues_excess(fleet: tuple[ProcGroup, list[SimEngine]]) -> None:
    group = fleet[0]
    # 25 tokens at 100 ms: the second request waits ~2.5 s, long enough to be seen on a loaded host
    [sim] = start_sims(group, 1, first_index=9, max_concurrency=1, itl_ms=100)
    body = {"prompt": "queued", "max_tokens": 25}
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(post, sim.url, body) for _ in range(2)]
        deadline, seen = time.monotonic() + 10, {}
        while time.monotonic() < deadline:
            seen = sim_stats(sim.url)
            if seen["waiting"] == 1:
                break
            time.sleep(0.01)
        assert (seen["running"], seen["waiting"]) == (1, 1)
        assert (
            'vllm:num_requests_waiting{engine="0",model_name="sim-model"} 1.0'
            in loopback.get(sim.url + "/metrics").text
        )
        assert [f.result().status_code for f in futures] == [200, 200]
    assert sim_stats(sim.url)["waiting"] == 0
