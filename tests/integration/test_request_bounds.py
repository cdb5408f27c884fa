"""Request bounds through a real router and real simulated engines: a poison ``max_tokens`` or
``min_tokens`` is a 400 that touches no engine, a context-length refusal by an engine is never
retried on another one, ``n <= 0`` is a 400, a head with bare-LF line ends is a 400 at once with
one INFO line, a lifecycle request naming an engine twice is a 422, and the simulator answers a
huge ``max_tokens`` at once instead of allocating per token."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.serving_support import contract_free_fleet, wait_until
from tests.support import loopback
from tests.support.fleet import SimEngine, sim_stats, start_sims
from tests.support.procs import proc_group
from tests.support.router import RouterHandle, start_router

pytestmark = pytest.mark.integration
MODEL = "sim-model"
POISON = 2**63 - 1


def _engine_requests(sims: list[SimEngine]) -> dict[str, int]:
    out = {}
    for s in sims:
        req = sim_stats(s.url)["requests"]
        out[s.iid] = req["prefill"] + req["decode"] + req["plain"]
    return out


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RouterHandle, list[SimEngine]]]:
    tmp = tmp_path_factory.mktemp("bounds")
    with proc_group(tmp) as group:
        # one prefill, two decode engines: a retry would land on the second decode engine
        sims = start_sims(group, 3, roles=["prefill", "decode", "decode"], itl_ms=1)
        fleet = contract_free_fleet(tmp, sims, max_attempts=2, max_request_bytes=65536)
        router = start_router(group, fleet, tmp, wait_ready=True)
        wait_until(lambda: "model context: 8192 tokens" in router.proc.output(), what="context learned")
        yield router, sims


def test_simulator_refuses_a_poison_max_tokens_at_once(
    stack: tuple[RouterHandle, list[SimEngine]],
) -> None:
    _, sims = stack
    body = {"model": MODEL, "prompt": "x", "max_tokens": POISON, "stream": True}
    r = loopback.post(sims[1].url + "/v1/completions", json=body, timeout=5)
    assert r.status_code == 400 and "maximum context length is 8192 tokens" in r.text
    assert loopback.get(sims[1].url + "/health", timeout=5).status_code == 200  # not wedged


@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens"])
def test_poison_max_tokens_is_a_400_that_touches_no_engine(
    stack: tuple[RouterHandle, list[SimEngine]], key: str
) -> None:
    router, sims = stack
    before = _engine_requests(sims)
    path = "/v1/completions" if key == "max_tokens" else "/v1/chat/completions"
    body: dict[str, object] = {"model": MODEL, key: POISON, "stream": True}
    body |= {"prompt": "x"} if key == "max_tokens" else {"messages": [{"role": "user", "content": "x"}]}
    r = router.post(path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("context_length_exceeded", key)
    assert "exceeds the model's context of 8192 tokens" in err["message"]
    assert _engine_requests(sims) == before
    assert router.post("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 8}).status_code == 200


def test_poison_min_tokens_is_a_400_naming_it(stack: tuple[RouterHandle, list[SimEngine]]) -> None:
    router, sims = stack
    before = _engine_requests(sims)
    r = router.post("/v1/completions", {"model": MODEL, "prompt": "x", "min_tokens": POISON})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens", r.text
    r = router.post("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 4, "min_tokens": 5})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == "min_tokens must be less than or equal to max_tokens=4, got 5."
    assert _engine_requests(sims) == before


_BARE_LF_HEADS = [
    b"POST /v1/completions HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: 2\n\n{}",
    b"POST /v1/completions HTTP/1.1\nHost: x\n",  # not complete yet: no head will ever come
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\nContent-Length: 2\r\n\r\n{}",
    b"GET /health HTTP/1.1\nHost: x\n\n",
]


def _answer(port: int, head: bytes) -> bytes:
    """What the router answers on a fresh connection (it closes after a malformed head)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head)
        data = b""
        while b"\r\n\r\n" not in data and (more := s.recv(65536)):
            data += more
        return data


def test_bare_lf_heads_are_a_400_at_once_with_one_info_line(
    stack: tuple[RouterHandle, list[SimEngine]],
) -> None:
    """The answer comes at once — the header timeout (10 s) would close without one — and each
    head costs one INFO line on the router's stderr, not aiohttp's traceback."""
    router, sims = stack
    before = _engine_requests(sims)
    marker = "INFO narwhal.front: malformed request from 127.0.0.1 answered 400: "
    seen = router.proc.output().count(marker)
    for head in _BARE_LF_HEADS:
        answer = _answer(router.port, head)
        assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), (head, answer)
    wait_until(lambda: router.proc.output().count(marker) == seen + len(_BARE_LF_HEADS), what="INFO lines")
    out = router.proc.output()
    assert "Traceback" not in out and "ERROR aiohttp" not in out, out[-3000:]
    assert router.metrics().get("narwhal_header_timeouts_total", 0.0) == 0.0
    assert _engine_requests(sims) == before


@pytest.mark.parametrize("n", [0, -1])
def test_n_below_one_is_a_400(stack: tuple[RouterHandle, list[SimEngine]], n: int) -> None:
    router, sims = stack
    before = _engine_requests(sims)
    r = router.post("/v1/completions", {"model": MODEL, "prompt": "x", "n": n})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    assert _engine_requests(sims) == before


def test_context_length_refused_by_the_engine_is_not_retried_elsewhere(
    stack: tuple[RouterHandle, list[SimEngine]],
) -> None:
    router, sims = stack
    m0 = router.metrics()
    before = {s.iid: sim_stats(s.url)["requests"]["decode"] for s in sims}
    prompt = "narwhal " * 4000  # ~8000 simulator tokens: with max_tokens 4000 over the 8192 context
    r = router.post("/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 4000})
    assert r.status_code == 400, r.text
    assert "maximum context length" in r.json()["error"]["message"]
    after = {s.iid: sim_stats(s.url)["requests"]["decode"] for s in sims}
    assert sum(after[i] - before[i] for i in after) == 1  # one decode engine asked, never a second
    m1 = router.metrics()
    assert (
        m1.get('narwhal_engine_ejected{iid="e1"}', 0) == 0
        and m1.get('narwhal_engine_ejected{iid="e2"}', 0) == 0
    )
    assert m1["narwhal_offered_total"] - m0["narwhal_offered_total"] == 1


@pytest.mark.parametrize("action", ["drain", "readmit"])
def test_lifecycle_request_naming_an_engine_twice_is_a_422(
    stack: tuple[RouterHandle, list[SimEngine]], action: str
) -> None:
    router, _ = stack
    r = router.post(f"/narwhal/lifecycle/{action}", {"engines": ["e1", "e1"]}, control=True)
    assert r.status_code == 422
    assert r.json()["error"] == "invalid request: engines: duplicate engine ID(s): e1"
    assert r.json()["engines"]["e1"]["state"] == "active"


def test_configured_max_tokens_limit_bounds_requests(tmp_path: Path) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 2, roles=["prefill", "decode"], itl_ms=1)
        fleet = contract_free_fleet(tmp_path, sims, max_tokens_limit=64)
        assert json.loads(fleet.read_text())["serving"]["max_tokens_limit"] == 64
        router = start_router(group, fleet, tmp_path, wait_ready=True)
        before = _engine_requests(sims)
        r = router.post("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 65})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert _engine_requests(sims) == before
        assert (
            router.post("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 64}).status_code
            == 200
        )
