"""An engine that sends its decode stream as 1-byte HTTP chunks, in one burst (a proxy in front of a
real simulated engine re-chunks it): through a real router the client gets the engine's answer,
and the router keeps serving other requests while it relays that stream.

(The bound itself — at most ``wire.READ_SLICE`` bytes of a read per event-loop callback — is
counted in ``tests/unit/test_relay_fast_path.py``; here it is the real processes.)
"""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from narwhal_testing.rechunk import RechunkProxy
from tests.integration.serving_support import contract_free_fleet
from tests.support import loopback
from tests.support.fleet import start_sims
from tests.support.procs import proc_group
from tests.support.router import start_router

pytestmark = pytest.mark.integration
MODEL = "sim-model"
HELD = 64  # body bytes the proxy keeps back until the test has its answer from /health


def test_a_one_byte_chunk_stream_is_relayed_whole_and_the_router_stays_responsive(tmp_path: Path) -> None:
    with proc_group(tmp_path) as group:
        sims = start_sims(group, 2, roles=["prefill", "decode"], itl_ms=0, ttft_base_ms=0)
        proxy = RechunkProxy(sims[1].port, hold=HELD)
        try:
            decode = dataclasses.replace(sims[1], url=proxy.url, port=proxy.port)
            fleet = contract_free_fleet(tmp_path, [sims[0], decode], max_request_bytes=1 << 20)
            doc = json.loads(fleet.read_text())
            doc["engine"] |= {"first_token_timeout_s": 60.0, "decode_read_timeout_s": 60.0}
            fleet.write_text(json.dumps(doc))
            router = start_router(group, fleet, tmp_path, wait_ready=True)

            # a long prompt with its token ids back: the first event alone is ~40 KB, sent as
            # ~240 KB of 1-byte chunks, then ~1,500 token events the same way
            prompt = "narwhal " * 3000
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 1500, "return_token_ids": True}
            events: list[bytes] = []
            first_bytes = threading.Event()
            failure: list[BaseException] = []

            def client() -> None:
                try:
                    with loopback.stream(
                        "POST", router.url + "/v1/completions", json={**body, "stream": True}, timeout=120
                    ) as r:
                        assert r.status_code == 200, r.read()
                        for line in r.iter_lines():
                            first_bytes.set()
                            if line.startswith("data: "):
                                events.append(line[6:].encode())
                except BaseException as exc:  # reported by the test thread
                    failure.append(exc)
                    first_bytes.set()

            reader = threading.Thread(target=client, daemon=True)
            reader.start()
            assert proxy.burst_sent.wait(60), "the decode engine's stream never reached the proxy"
            assert first_bytes.wait(60) and not failure, failure
            # The stream is open at the router (its last bytes are held back): other requests
            # are served meanwhile.
            assert router.get("/health", timeout=30).status_code == 200
            assert not events or events[-1] != b"[DONE]"
            proxy.release()
            reader.join(120)
            assert not reader.is_alive() and not failure, failure
        finally:
            proxy.close()

        assert events[-1] == b"[DONE]"
        docs: list[dict[str, Any]] = [orjson.loads(e) for e in events[:-1]]
        text = "".join(c["text"] for d in docs for c in d["choices"])
        token_ids = [t for d in docs for c in d["choices"] for t in c.get("token_ids") or []]
        # the engine's own answer: the same request to the decode engine directly, not streamed
        direct = loopback.post(sims[1].url + "/v1/completions", json=body, timeout=60).json()
        assert text == direct["choices"][0]["text"]
        assert token_ids == direct["choices"][0]["token_ids"] and len(token_ids) == 1500
