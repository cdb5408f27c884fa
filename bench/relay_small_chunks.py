"""How long one engine read of 1-byte HTTP chunks holds the router's event loop.

In-process: a decode stream (one ~100 KB event, then token events, then ``[DONE]``) re-chunked into
1-byte HTTP chunks and fed to a real ``EngineConnection`` + ``ClientRelay`` in reads of 256 KiB (what
the transport hands over at most). A ticker on the same loop records the gaps between its turns:
the longest gap is the longest time anything else on the loop (other clients, timers) waited
(wall time: on a loaded machine it includes preemption); the stream's total is CPU time.
Run with ``--slice N`` to compare slice sizes (``--slice 0``: one read in one callback, as before
the bound). Prints a markdown row per run.

    .venv/bin/python bench/relay_small_chunks.py [--slice 16384] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from types import SimpleNamespace

import orjson

from router.engines import wire
from router.engines.legs import DecodeStream
from router.engines.wire import EngineConnection, EnginePool
from router.serving.relay import StreamState
from router.serving.stream import ClientRelay

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
READ = 262144


class _Transport:
    def __init__(self) -> None:
        self.sent = 0

    def write(self, data: bytes) -> None:
        self.sent += len(data)

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def get_extra_info(self, name: str) -> None:
        return None


def _event(text: str, i: int) -> bytes:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None, "token_ids": [i]}
    return (
        b"data: " + orjson.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [choice]}) + b"\n\n"
    )


def _wire() -> bytes:
    body = _event("x" * 100_000, 0) + b"".join(_event(" a", i) for i in range(2000)) + b"data: [DONE]\n\n"
    return HEAD + b"".join(b"1\r\n%c\r\n" % c for c in body) + b"0\r\n\r\n"


async def _run(data: bytes) -> tuple[float, float]:
    loop = asyncio.get_running_loop()
    conn = EngineConnection(EnginePool(1.0), ("127.0.0.1", 1), loop)
    conn.connection_made(_Transport())  # type: ignore[arg-type]
    resp = conn.send(b"", 1 << 30)
    conn.data_received(data[: len(HEAD)])
    relay = ClientRelay(
        DecodeStream(resp, "e"),
        _Transport(),  # type: ignore[arg-type]
        SimpleNamespace(writing_paused=False),  # type: ignore[arg-type]
        True,
        StreamState(),
        False,
    )
    relay.start()
    gaps: list[float] = []
    last = time.perf_counter()

    def tick() -> None:
        nonlocal last
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
        if not relay.finished:
            loop.call_soon(tick)

    t0 = time.process_time()
    loop.call_soon(tick)
    for i in range(len(HEAD), len(data), READ):
        conn.data_received(data[i : i + READ])
        for _ in range(-(-len(conn.backlog) // wire.READ_SLICE) + 1):
            await asyncio.sleep(0)  # one slice per turn of the loop
        assert not conn.backlog
    assert relay.finished and relay.signal.result() == "done"
    return max(gaps), time.process_time() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slice", type=int, default=wire.READ_SLICE, help="bytes per callback (0: a whole read)")
    p.add_argument("--repeat", type=int, default=5)
    ns = p.parse_args()
    wire.READ_SLICE = ns.slice or (1 << 40)
    data = _wire()
    runs = [asyncio.run(_run(data)) for _ in range(ns.repeat)]
    worst = statistics.median(r[0] for r in runs) * 1000
    total = statistics.median(r[1] for r in runs) * 1000
    print("| slice | wire bytes | longest loop gap (median of runs) | CPU for the whole stream |")
    print("|---|---|---|---|")
    print(f"| {ns.slice or 'whole read'} | {len(data):,} | {worst:.1f} ms | {total:.0f} ms |")


if __name__ == "__main__":
    main()
