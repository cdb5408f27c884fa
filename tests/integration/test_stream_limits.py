"""Streams at their limits through a real router over real simulated engines: a 1 byte/s reader is
cut (``cancelled``/``slow_client``) and its engine slot freed, ``serving.max_response_bytes`` cuts
an answer (502 before output, an error event after; never retried), ``slo`` counts ``slo_met``,
and engines that end SSE lines with CRLF or CR are relayed like LF ones."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.serving_support import contract_free_fleet, wait_until
from tests.support.fleet import SimEngine, sim_stats, start_sims
from tests.support.procs import proc_group
from tests.support.router import RouterHandle, start_router

pytestmark = pytest.mark.integration
MODEL = "sim-model"


def _fleet(tmp: Path, sims: list[SimEngine], slo: dict[str, float] | None = None, **serving: Any) -> Path:
    tmp.mkdir(exist_ok=True)
    path = contract_free_fleet(tmp, sims, **serving)
    doc = json.loads(path.read_text())
    if slo is None:
        doc.pop("slo", None)
    else:
        doc["slo"] = slo
    path.write_text(json.dumps(doc))
    return path


def _stream_lines(router: RouterHandle, body: dict[str, Any]) -> list[str]:
    r = router.post("/v1/completions", {**body, "stream": True})
    assert r.status_code == 200, r.text
    return [line for line in r.text.split("\n") if line]


class _SlowReader:
    """A raw-socket client with a small receive buffer that reads one byte per second."""

    def __init__(self, port: int, body: dict[str, Any]) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect(("127.0.0.1", port))
        raw = json.dumps(body).encode()
        head = (
            f"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(raw)}\r\n\r\n"
        ).encode()
        self.sock.sendall(head + raw)
        self.got = b""
        self.ended = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while not self.ended.is_set():
                b = self.sock.recv(1)
                if not b:
                    break
                self.got += b
                time.sleep(1.0)  # the client's reading speed: 1 byte/s
        except OSError:
            pass
        finally:
            self.ended.set()

    def close(self) -> None:
        self.ended.set()
        self.sock.close()
        self.thread.join(timeout=5)


def test_slow_reader_is_cut_and_frees_its_engine_slot(tmp_path: Path) -> None:
    with proc_group(tmp_path) as group:
        # more output than the kernel's socket buffers hold (up to 4 MiB each way on loopback)
        sims = start_sims(group, 2, itl_ms=0, max_model_len=100_000)
        router = start_router(
            group, _fleet(tmp_path / "r", sims, client_write_timeout_s=1.0), tmp_path, wait_ready=True
        )
        decode = sims[1]
        m0 = router.metrics()
        cancelled0 = sim_stats(decode.url)["cancelled_streams"]
        reader = _SlowReader(
            router.port, {"model": MODEL, "prompt": "slow", "max_tokens": 80_000, "stream": True}
        )
        try:
            row = wait_until(
                lambda: [r for r in router.journal_rows() if r.get("reason") == "slow_client"],
                timeout=120,
                what="the slow client's stream cut",
            )[0]
            wait_until(lambda: sim_stats(decode.url)["active_streams"] == 0, what="the engine slot freed")
        finally:
            reader.close()
        assert row["terminal"] == "cancelled" and row["cancelled"] is True
        assert row["cancelled_phase"] == "decode" and 0 < row["output_len"] < 80_000
        assert sim_stats(decode.url)["cancelled_streams"] == cancelled0 + 1
        m = wait_until(lambda: (mm := router.metrics())["narwhal_inflight_requests"] == 0 and mm, what="idle")
        assert m['narwhal_engine_resident{iid="e1",phase="decode"}'] == 0
        assert m["narwhal_cancelled_total"] - m0["narwhal_cancelled_total"] == 1
        assert m["narwhal_served_total"] == m0["narwhal_served_total"]
        # the router still serves
        assert (
            router.post("/v1/completions", {"model": MODEL, "prompt": "ok", "max_tokens": 2}).status_code
            == 200
        )


def test_response_limit_cuts_without_retry(tmp_path: Path) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 3, roles=["prefill", "decode", "decode"])
        router = start_router(
            group, _fleet(tmp_path / "r", sims, max_response_bytes=4096), tmp_path, wait_ready=True
        )
        small = {"model": MODEL, "prompt": "small", "max_tokens": 3}
        assert router.post("/v1/completions", small).status_code == 200
        decodes0 = sum(sim_stats(s.url)["requests"]["decode"] for s in sims[1:])
        m0 = router.metrics()
        # (a buffered answer is the engine's one document: 1000 tokens make it larger than 4096 bytes)
        big = {"model": MODEL, "prompt": "big", "max_tokens": 1000}
        r = router.post("/v1/completions", big)
        assert r.status_code == 502, r.text
        assert r.json()["error"]["code"] == "response_limit", r.text
        lines = _stream_lines(router, big)
        frames = [line for line in lines if line.startswith("data: {") and '"error"' not in line]
        err = json.loads(lines[-1][6:])
        assert frames and err["error"]["code"] == "response_limit" and "[DONE]" not in lines[-1]
        m1 = router.metrics()
        assert (
            m1['narwhal_failed_total{reason="response_limit"}']
            - m0['narwhal_failed_total{reason="response_limit"}']
            == 2
        )
        assert sum(sim_stats(s.url)["requests"]["decode"] for s in sims[1:]) - decodes0 == 2  # no retry
        assert not any(m1[f'narwhal_engine_ejected{{iid="{s.iid}"}}'] for s in sims)
        assert router.post("/v1/completions", small).status_code == 200


def test_slo_met_counts_served_requests_within_the_objectives(tmp_path: Path) -> None:
    body = {"model": MODEL, "prompt": "slo", "max_tokens": 4}
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 2)
        loose = start_router(
            group,
            _fleet(tmp_path / "a", sims, slo={"ttft_s": 120.0, "tpot_s": 60.0}),
            tmp_path / "a",
            wait_ready=True,
            name="loose",
        )
        tight = start_router(
            group,
            _fleet(tmp_path / "b", sims, slo={"ttft_s": 1e-9, "tpot_s": 60.0}),
            tmp_path / "b",
            wait_ready=True,
            name="tight",
        )
        for router in (loose, tight):
            for stream in (False, True, False):
                assert router.post("/v1/completions", {**body, "stream": stream}).status_code == 200
        m = wait_until(lambda: (mm := loose.metrics())["narwhal_served_total"] == 3 and mm, what="served")
        assert m["narwhal_slo_met_total"] == 3
        m = wait_until(lambda: (mm := tight.metrics())["narwhal_served_total"] == 3 and mm, what="served")
        assert m["narwhal_slo_met_total"] == 0
        rows = wait_until(
            lambda: (
                (rr := [r for r in loose.journal_rows() if r.get("terminal") == "completed"])
                and len(rr) == 3
                and rr
            ),
            what="three journal rows",
        )
        assert len(rows) == 3 and all(r["tpot_s"] is not None and r["tpot_s"] >= 0 for r in rows)


@pytest.mark.parametrize("ending", ["crlf", "cr"])
def test_engines_framing_sse_with_crlf_or_cr_are_relayed(tmp_path: Path, ending: str) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 2, sse_line_ending=ending)
        router = start_router(group, _fleet(tmp_path / "r", sims), tmp_path, wait_ready=True)
        body = {"model": MODEL, "prompt": "line endings", "max_tokens": 12}
        whole = router.post("/v1/completions", body)
        assert whole.status_code == 200, whole.text
        doc = whole.json()
        assert doc["usage"]["completion_tokens"] == 12 and doc["choices"][0]["text"]
        lines = _stream_lines(router, body)
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(line[6:]) for line in lines[:-1]]
        assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == doc["choices"][0]["text"]
        assert all("token_ids" not in c["choices"][0] for c in chunks if c["choices"])
        rows = wait_until(
            lambda: (
                (rr := [r for r in router.journal_rows() if r.get("terminal") == "completed"])
                and len(rr) == 2
                and rr
            ),
            what="two journal rows",
        )
        assert [r["output_len"] for r in rows] == [12, 12]
