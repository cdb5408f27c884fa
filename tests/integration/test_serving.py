"""Serving through a real router process over real simulated engines: OpenAI client, PD split, bad
input, client disconnect, journal, counters identity."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h11
import openai
import pytest

from tests.integration.serving_support import contract_free_fleet, settled_rows, terminal_sum, wait_until
from tests.support import loopback
from tests.support.fleet import SimEngine, reset_faults, set_fault, sim_stats, start_sims
from tests.support.procs import proc_group
from tests.support.router import RouterHandle, start_router

pytestmark = pytest.mark.integration
MODEL = "sim-model"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RouterHandle, list[SimEngine]]]:
    tmp = tmp_path_factory.mktemp("serving")
    with proc_group(tmp) as group:
        sims = start_sims(group, 3, roles=["prefill", "decode", "decode"])
        router = start_router(group, contract_free_fleet(tmp, sims), tmp, wait_ready=True)
        yield router, sims


def test_openai_client_completions_and_chat_pd_split(fleet: tuple[RouterHandle, list[SimEngine]]) -> None:
    router, sims = fleet
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
    before = {s.iid: sim_stats(s.url) for s in sims}

    c = client.completions.create(model=MODEL, prompt="the narwhal", max_tokens=6)
    assert c.object == "text_completion" and c.choices[0].text
    assert c.usage is not None and c.usage.completion_tokens == 6

    text = "".join(
        ch.choices[0].text
        for ch in client.completions.create(model=MODEL, prompt="the narwhal", max_tokens=6, stream=True)
        if ch.choices
    )
    assert text == c.choices[0].text  # the simulator is deterministic per prompt

    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    assert chat.object == "chat.completion" and chat.choices[0].message.content
    assert chat.choices[0].message.role == "assistant" and chat.usage is not None

    parts = [
        ch.choices[0].delta.content or ""
        for ch in client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True
        )
        if ch.choices
    ]
    assert "".join(parts) == chat.choices[0].message.content
    assert client.models.list().data[0].id == MODEL

    after = {s.iid: sim_stats(s.url) for s in sims}
    assert after["e0"]["requests"]["prefill"] - before["e0"]["requests"]["prefill"] == 4
    decodes = sum(after[i]["requests"]["decode"] - before[i]["requests"]["decode"] for i in ("e1", "e2"))
    pulls = sum(after[i]["kv_pulls_done"] - before[i]["kv_pulls_done"] for i in ("e1", "e2"))
    assert decodes == 4 and pulls == 4  # every decode pulled its KV from the prefill engine
    rows = settled_rows(router)[-4:]
    assert all(r["prefill_iid"] == "e0" and r["decode_iid"] in ("e1", "e2") and r["crossed"] for r in rows)
    assert all(r["terminal"] == "completed" and r["status"] == 200 and r["output_len"] > 0 for r in rows)


def test_sse_strips_engine_fields_unless_asked(fleet: tuple[RouterHandle, list[SimEngine]]) -> None:
    router, _ = fleet
    body = {"model": MODEL, "prompt": "x y z", "max_tokens": 3, "stream": True}
    plain = router.post("/v1/completions", body, headers={"x-request-id": "client-42"})
    assert plain.status_code == 200 and plain.headers["content-type"].startswith("text/event-stream")
    assert "token_ids" not in plain.text and plain.text.endswith("data: [DONE]\n\n")
    rid = plain.headers["x-request-id"]
    assert rid != "client-42"
    row = wait_until(lambda: [r for r in router.journal_rows() if r.get("rid") == rid], what="journal row")[0]
    assert row["client_rid"] == "client-42"
    asked = router.post("/v1/completions", {**body, "return_token_ids": True})
    frames = [json.loads(line[6:]) for line in asked.text.splitlines() if line.startswith("data: {")]
    assert sum(len(f["choices"][0]["token_ids"]) for f in frames if f["choices"]) == 3
    buffered = router.post("/v1/completions", {**body, "stream": False, "return_token_ids": True}).json()
    assert len(buffered["choices"][0]["token_ids"]) == 3


BAD: list[tuple[str, Any, int, str | None]] = [
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", b"[1, 2]", 400, None),
    ("/v1/completions", {"model": MODEL, "prompt": 5}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "9"}, 400, "max_tokens"),
    ("/v1/chat/completions", {"model": MODEL, "messages": "hi"}, 400, "messages"),
    ("/v1/completions", {"model": "gpt-x", "prompt": "x"}, 404, "model"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 0}, 400, "n"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "prompt_logprobs": 1}, 400, "prompt_logprobs"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "best_of": 2}, 400, "best_of"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "kv_transfer_params": {}}, 400, "kv_transfer_params"),
    (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "vllm_xargs": {"kv_transfer_params": {}},
        },
        400,
        "vllm_xargs.kv_transfer_params",
    ),
    ("/v1/completions", {"model": MODEL, "prompt": "x" * 10_000}, 413, None),
]


def test_bad_input_gets_spec_errors_and_disturbs_nothing(fleet: tuple[RouterHandle, list[SimEngine]]) -> None:
    router, sims = fleet
    m0 = router.metrics()
    engine_before = [sim_stats(s.url)["requests"] for s in sims]
    for path, body, status, param in BAD:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = loopback.post(
            router.url + path, content=raw, headers={"content-type": "application/json"}, timeout=10
        )
        assert r.status_code == status, (path, body, r.text)
        err = r.json()["error"]
        assert isinstance(err["message"], str) and err["message"]
        assert err["type"] == ("request_too_large" if status == 413 else "invalid_request_error")
        if param is not None:
            assert err.get("param") == param
        if status == 404:
            assert err["code"] == "model_not_found"
    m1 = router.metrics()
    assert m1["narwhal_invalid_requests_total"] - m0["narwhal_invalid_requests_total"] == len(BAD)
    assert m1["narwhal_offered_total"] - m0["narwhal_offered_total"] == len(BAD)
    assert m1["narwhal_served_total"] == m0["narwhal_served_total"]
    assert [sim_stats(s.url)["requests"] for s in sims] == engine_before  # no engine saw them
    assert (
        router.post("/v1/completions", {"model": MODEL, "prompt": "ok", "max_tokens": 2}).status_code == 200
    )


def _responses(sock: socket.socket, n: int) -> list[tuple[int, dict[bytes, bytes], bytes]]:
    """``n`` responses read off one connection with h11 (strict framing: chunked or length)."""
    conn = h11.Connection(h11.CLIENT)
    out: list[tuple[int, dict[bytes, bytes], bytes]] = []
    for _ in range(n):
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
        conn.send(h11.Request(method="POST", target="/", headers=[("host", "r"), ("content-length", "0")]))
        conn.send(h11.EndOfMessage())
        status, headers, body = 0, {}, b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(sock.recv(65536))
            elif isinstance(event, h11.Response):
                status, headers = event.status_code, dict(event.headers)
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
        out.append((status, headers, body))
    return out


def test_one_connection_carries_pipelined_completions_health_and_a_chunked_request(
    fleet: tuple[RouterHandle, list[SimEngine]],
) -> None:
    """The client listener serves completions itself and hands other requests to aiohttp on the
    same keep-alive connection, in order; a chunked request body (aiohttp's) is served the same."""
    router, sims = fleet
    prefill_before = sim_stats(sims[0].url)["requests"]["prefill"]

    def post(body: dict[str, Any], extra: bytes = b"") -> bytes:
        raw = json.dumps(body).encode()
        return b"POST /v1/completions HTTP/1.1\r\nHost: r\r\n%sContent-Length: %d\r\n\r\n%s" % (
            extra,
            len(raw),
            raw,
        )

    chunked = json.dumps({"model": MODEL, "prompt": "chunks", "max_tokens": 2}).encode()
    with socket.create_connection(("127.0.0.1", router.port), timeout=30) as sock:
        sock.sendall(post({"model": MODEL, "prompt": "one", "max_tokens": 3}, b"X-Request-Id: pipe-1\r\n"))
        ((status, headers, body),) = _responses(sock, 1)
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 3
        assert headers[b"content-type"] == b"application/json" and len(headers[b"x-request-id"]) == 32
        sock.sendall(
            post(
                {
                    "model": MODEL,
                    "prompt": "two words",
                    "max_tokens": 4,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
                b"X-Request-Id: pipe-2\r\n",
            )
            + b"GET /health HTTP/1.1\r\nHost: r\r\n\r\n"
            + b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"%x\r\n%s\r\n0\r\n\r\n" % (len(chunked), chunked)
        )
        streamed, health, whole = _responses(sock, 3)
    assert streamed[0] == 200 and streamed[1][b"content-type"] == b"text/event-stream"
    events = [line for line in streamed[2].split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"data: [DONE]" and len(events) >= 5  # four tokens (+ usage) and [DONE]
    assert health[0] == 200 and json.loads(health[2])["status"]
    assert whole[0] == 200 and json.loads(whole[2])["usage"]["completion_tokens"] == 2
    assert sim_stats(sims[0].url)["requests"]["prefill"] - prefill_before == 3  # all three reached it
    row = wait_until(
        lambda: [r for r in router.journal_rows() if r.get("client_rid") == "pipe-1"], what="row"
    )
    assert row[0]["terminal"] == "completed" and row[0]["output_len"] == 3
    # A stream's row carries the prompt's length: the prompt_token_ids the decode leg's
    # return_token_ids brings (counted on bytes, cut out for this client), as the engine's usage says.
    usage = [json.loads(e[6:])["usage"] for e in events[:-1] if b'"usage":{' in e][-1]
    streamed_row = wait_until(
        lambda: [r for r in router.journal_rows() if r.get("client_rid") == "pipe-2"], what="row"
    )
    assert streamed_row[0]["input_len"] == usage["prompt_tokens"] > 0
    assert streamed_row[0]["output_len"] == usage["completion_tokens"] == 4
    assert b"token_ids" not in streamed[2]


def test_client_disconnect_cancels_and_closes_the_decode_stream(
    fleet: tuple[RouterHandle, list[SimEngine]],
) -> None:
    router, sims = fleet
    decoders = sims[1:]
    for s in decoders:
        set_fault(s.url, slow_ms=20)
    try:
        m0 = router.metrics()
        cancelled0 = sum(sim_stats(s.url)["cancelled_streams"] for s in decoders)
        body = {"model": MODEL, "prompt": "long one", "max_tokens": 500, "stream": True}
        with (
            loopback.client(timeout=10) as client,
            client.stream("POST", router.url + "/v1/completions", json=body) as r,
        ):
            assert r.status_code == 200
            lines = r.iter_lines()
            got = [next(lines) for _ in range(3)]
            assert got[0].startswith("data: ")
        wait_until(
            lambda: router.metrics()["narwhal_cancelled_total"] == m0["narwhal_cancelled_total"] + 1,
            what="cancelled counter",
        )
        wait_until(
            lambda: sum(sim_stats(s.url)["cancelled_streams"] for s in decoders) == cancelled0 + 1,
            what="engine decode stream closed",
        )
        assert all(sim_stats(s.url)["active_streams"] == 0 for s in decoders)
        assert router.metrics()["narwhal_served_total"] == m0["narwhal_served_total"]
        row = wait_until(
            lambda: [r for r in router.journal_rows() if r.get("terminal") == "cancelled"], what="row"
        )[-1]
        assert row["cancelled"] is True and row["cancelled_phase"] == "decode"
    finally:
        for s in decoders:
            reset_faults(s.url)


def test_journal_header_rows_and_counter_identity(fleet: tuple[RouterHandle, list[SimEngine]]) -> None:
    router, _ = fleet
    m = wait_until(lambda: (mm := router.metrics())["narwhal_inflight_requests"] == 0 and mm, what="idle")
    assert m["narwhal_offered_total"] == terminal_sum(m) > 0
    rows = router.journal_rows()
    meta = rows[0]["meta"]
    assert meta["schema"] == "narwhal.journal" and meta["package"] == "narwhal-restart"
    assert meta["version"] and meta["source"].startswith("sha256:") and "git" in meta
    requests = [r for r in rows[1:] if "rid" in r]
    run = requests[0]["run"]
    assert all(r["run"] == run and r["schema"] == "narwhal.journal" for r in rows[1:])
    wait_until(
        lambda: len([r for r in router.journal_rows() if "rid" in r]) == m["narwhal_offered_total"],
        what="one journal row per request",
    )
    for key in (
        "rid",
        "client_rid",
        "arrived",
        "status",
        "terminal",
        "reason",
        "prefill_iid",
        "decode_iid",
        "attempts",
        "ttft_s",
        "duration_s",
        "output_len",
        "error",
    ):
        assert key in requests[0]
    assert router.get("/health").json() == {"status": "ok", "instances": 3, "available_instances": 3}
    ready = router.get("/ready")
    assert ready.status_code == 200 and ready.json() == {
        "status": "ready",
        "control_ready": True,
        "epoch": 0,
        "holder": "",
        "reason": "",
        "control_degraded": "",
        "lease_problem": "",
    }
    assert router.get("/metrics").headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"


def test_inflight_limit_answers_429(tmp_path: Path) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 2, itl_ms=20)
        router = start_router(
            group,
            contract_free_fleet(tmp_path, sims),
            tmp_path,
            extra_args=["--max-concurrent", "1"],
            wait_ready=True,
        )
        body = {"model": MODEL, "prompt": "x", "max_tokens": 50, "stream": True}
        with (
            loopback.client(timeout=10) as client,
            client.stream("POST", router.url + "/v1/completions", json=body) as r,
        ):
            lines = r.iter_lines()  # keep a reference: a dropped iterator closes the stream
            next(lines)
            second = router.post("/v1/completions", {**body, "stream": False})
            assert second.status_code == 429 and second.headers["retry-after"] == "1"
            assert second.json()["error"]["code"] == "inflight_limit"
        m = router.metrics()
        assert m['narwhal_rejected_total{reason="inflight_limit"}'] == 1


def test_sigterm_finishes_in_flight_streams(tmp_path: Path) -> None:
    import signal

    with proc_group(tmp_path) as group:
        sims = start_sims(group, 2, itl_ms=10)
        router = start_router(group, contract_free_fleet(tmp_path, sims), tmp_path, wait_ready=True)
        body = {"model": MODEL, "prompt": "x", "max_tokens": 60, "stream": True}
        with (
            loopback.client(timeout=10) as client,
            client.stream("POST", router.url + "/v1/completions", json=body) as r,
        ):
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            router.proc.signal(signal.SIGTERM)
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        assert router.proc.popen.wait(timeout=15) == 0
        rows = [r for r in router.journal_rows() if "rid" in r]
        assert rows[-1]["terminal"] == "completed"
