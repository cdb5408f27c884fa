"""The Rust PD router ``vllm-router`` (PyPI) in front of two simulated engines: the sim must speak
real vLLM's NIXL dialect well enough for an unmodified peer to hand a descriptor from prefill to decode."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.support import loopback
from tests.support.fleet import SimEngine, sim_stats, start_sims, vllm_router_command
from tests.support.procs import BIN, ProcGroup, free_port, wait_http

pytestmark = pytest.mark.integration
ROUTER = BIN / "vllm-router"


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[SimEngine]]]:
    # vllm-router is a dev dependency: its absence is a broken install, not a reason to skip.
    assert ROUTER.exists(), "vllm-router is not installed (pip install -e '.[dev]')"
    group = ProcGroup(tmp_path_factory.mktemp("vllm_router"))
    try:
        sims = start_sims(group, 2, roles=["prefill", "decode"])
        port = free_port()
        proc = group.start(
            "vllm-router",
            vllm_router_command([sims[0].url], [sims[1].url], port, Path(group.log_dir)),
        )
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", timeout=30, proc=proc)
        yield url, sims
    finally:
        group.close()


def test_completion_through_vllm_router(routed: tuple[str, list[SimEngine]]) -> None:
    url, (prefill, decode) = routed
    p0, d0 = sim_stats(prefill.url), sim_stats(decode.url)
    body = {"model": "sim-model", "prompt": "through the rust router", "max_tokens": 6}
    r = loopback.post(url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["text"]
    direct = loopback.post(decode.url + "/v1/completions", json=body, timeout=30).json()
    assert text == direct["choices"][0]["text"]
    p1, d1 = sim_stats(prefill.url), sim_stats(decode.url)
    assert p1["requests"]["prefill"] == p0["requests"]["prefill"] + 1
    assert p1["kv_pulls_served"] == p0["kv_pulls_served"] + 1
    assert d1["requests"]["decode"] == d0["requests"]["decode"] + 1
    assert d1["kv_pulls_done"] == d0["kv_pulls_done"] + 1
    assert d1["kv_pulls_failed"] == d0["kv_pulls_failed"]


def test_streaming_chat_through_vllm_router(routed: tuple[str, list[SimEngine]]) -> None:
    url, (prefill, decode) = routed
    d0 = sim_stats(decode.url)
    body = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 4,
        "stream": True,
    }
    r = loopback.post(url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    frames = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    text = "".join(orjson.loads(f)["choices"][0]["delta"].get("content", "") for f in frames[:-1])
    assert len(text.split()) == 4
    d1 = sim_stats(decode.url)
    assert d1["kv_pulls_done"] == d0["kv_pulls_done"] + 1
    assert sim_stats(prefill.url)["kv_blocks_held"] == 0  # every produced block was pulled
