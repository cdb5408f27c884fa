"""``serving.max_connections`` bounds the engine connection pool: the router keeps at most that many
connections to the engines open (seen from the engine's side), reuses them, and never makes a leg
wait for one."""

from __future__ import annotations

import asyncio

from router.config import parse_fleet
from router.engines.legs import EngineClient


class CountingEngine:
    """A TCP listener that counts the connections it accepted and those the router closed."""

    def __init__(self) -> None:
        self.accepted = 0
        self.closed = 0
        self.changed = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.changed.set()
        await reader.read()  # until the router closes it
        self.closed += 1
        self.changed.set()
        writer.close()

    async def until(self, accepted: int, closed: int) -> None:
        while (self.accepted, self.closed) != (accepted, closed):
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), timeout=10)


async def test_the_pool_keeps_at_most_max_connections_open() -> None:
    engine = CountingEngine()
    server = await asyncio.start_server(engine.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    cfg = parse_fleet(
        {
            "model": "m",
            "engines": [{"iid": "e0", "url": f"http://127.0.0.1:{port}"}],
            "serving": {"max_connections": 2},
        }
    )
    client = EngineClient(cfg)
    pool, key = client.pool, ("127.0.0.1", port)
    try:
        legs = [await pool.acquire(key) for _ in range(3)]  # three legs at once: none waits
        await engine.until(accepted=3, closed=0)
        for conn in legs:  # the legs end: two stay open for reuse, the third is closed
            pool.put(conn)
        await engine.until(accepted=3, closed=1)
        assert pool.open_connections == 2
        again = [await pool.acquire(key) for _ in range(2)]
        assert all(conn.reused for conn in again)
        assert engine.accepted == 3  # reused, not reconnected
    finally:
        pool.close()
        server.close()
        await server.wait_closed()


async def test_the_default_pool_bound_is_the_default_seat_count() -> None:
    cfg = parse_fleet({"model": "m", "engines": [{"iid": "e0", "url": "http://127.0.0.1:1"}]})
    assert EngineClient(cfg).pool.max_open == cfg.serving.max_connections == 768
