"""Per-process engine state: identity, counters, produced KV blocks, deterministic tokens."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import random
import struct
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fleet.sim.config import Faults, SimConfig

_VOCAB = (
    "the of and to in is was for on that with as by at from this it an be are or which have not "
    "narwhal tusk ocean ice arctic pod whale deep blue cold current swim dive surface light north "
    "fjord krill song echo tide drift floe polar water wave reef kelp gull seal orca shoal breach "
    "calm storm dawn dusk star moon sun wind salt foam spray shore harbor sail anchor compass map"
).split()
_MASK64 = (1 << 64) - 1
MAX_BLOCKS = 200_000


def approx_tokens(text: str) -> int:
    return len(text) // 4 + 1


def iter_tokens(key: bytes, seed: int, n: int) -> Iterator[int]:
    """Deterministic token ids for a prompt key (same prompt + seed → same tokens on any engine),
    produced one at a time: a stream never allocates per requested token up front."""
    x = int.from_bytes(hashlib.blake2b(key + seed.to_bytes(8, "little", signed=True), digest_size=8).digest())
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) & _MASK64
        yield 100 + (x >> 33) % 31_900


def output_tokens(key: bytes, seed: int, n: int) -> list[int]:
    return list(iter_tokens(key, seed, n))


def token_text(token_id: int) -> str:
    return " " + _VOCAB[token_id % len(_VOCAB)]


def prompt_token_ids(key: bytes, n: int) -> list[int]:
    """The prompt's token ids (what ``return_token_ids`` reports): deterministic per prompt, and
    made at C speed — a real engine has them from tokenizing the prompt, so they must not cost
    the simulator a Python loop per prompt token (≈2 ms for a 4,000-token prompt)."""
    raw = hashlib.shake_128(b"prompt:" + key).digest(2 * n)
    return list(struct.unpack(f"<{n}H", raw))


def flat_block_ids(value: Any) -> list[int] | None:
    """Flat or grouped (one list per KV cache group) non-negative block ids; None when malformed."""
    if not isinstance(value, list):
        return None
    out: list[int] = []
    for item in value:
        items: Iterable[Any] = item if isinstance(item, list) else (item,)
        for b in items:
            if not isinstance(b, int) or isinstance(b, bool) or b < 0:
                return None
            out.append(b)
    return out


class KvStore:
    """Blocks this engine produced for remote decode; bounded, expiring after the KV lease."""

    def __init__(self, lease_s: float, capacity: int = MAX_BLOCKS) -> None:
        self.lease_s = lease_s
        self.capacity = capacity
        self._blocks: OrderedDict[int, float] = OrderedDict()
        self._next = 1

    def __len__(self) -> int:
        return len(self._blocks)

    def allocate(self, n: int, now: float) -> list[int]:
        self.expire(now)
        ids = list(range(self._next, self._next + n))
        self._next += n
        for b in ids:
            self._blocks[b] = now + self.lease_s
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
        return ids

    def expire(self, now: float) -> None:
        while self._blocks:
            b, deadline = next(iter(self._blocks.items()))
            if deadline > now:
                break
            del self._blocks[b]

    def take(self, ids: list[int], now: float) -> bool:
        """Hand the blocks to a consumer (freeing them); False if any is unknown or expired."""
        self.expire(now)
        if not ids or any(b not in self._blocks for b in ids):
            return False
        for b in ids:
            del self._blocks[b]
        return True


@dataclass
class Stats:
    requests: dict[str, int] = field(default_factory=lambda: {"prefill": 0, "decode": 0, "plain": 0})
    active_streams: int = 0
    cancelled_streams: int = 0
    completed: int = 0
    errors: int = 0
    kv_pulls_served: int = 0
    kv_pulls_refused: int = 0
    kv_pulls_done: int = 0
    kv_pulls_failed: int = 0
    running: int = 0
    waiting: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0

    def document(self) -> dict[str, Any]:
        return {
            "requests": dict(self.requests),
            **self.requests,
            "active_streams": self.active_streams,
            "cancelled_streams": self.cancelled_streams,
            "completed": self.completed,
            "errors": self.errors,
            "kv_pulls_served": self.kv_pulls_served,
            "kv_pulls_refused": self.kv_pulls_refused,
            "kv_pulls_done": self.kv_pulls_done,
            "kv_pulls_failed": self.kv_pulls_failed,
            "running": self.running,
            "waiting": self.waiting,
            "prompt_tokens": self.prompt_tokens,
            "generation_tokens": self.generation_tokens,
        }


class EngineState:
    def __init__(self, cfg: SimConfig, process_start: float | None = None) -> None:
        self.cfg = cfg
        self.process_start = time.time() if process_start is None else process_start
        self.engine_id = f"{cfg.iid}-{uuid.uuid4().hex[:12]}"
        self.faults = Faults(error_rate=cfg.error_rate)  # a degraded build fails from the start
        self.stats = Stats()
        self.kv = KvStore(cfg.kv_lease_s)
        self.rng = random.Random(cfg.seed)
        self.seats = asyncio.Semaphore(cfg.max_concurrency)
        self.unhung = asyncio.Event()
        self.unhung.set()
        self.unstalled = asyncio.Event()  # cleared while the stall_body fault is on
        self.unstalled.set()
        # The last completion requests as received (GET /sim/requests): path, x-request-id, body.
        self.received: collections.deque[tuple[str, str | None, bytes]] = collections.deque(maxlen=256)

    def record(self, path: str, request_id: str | None, body: bytes) -> None:
        self.received.append((path, request_id, body))

    @property
    def kv_layout(self) -> str:
        return self.faults.kv_layout or self.cfg.kv_layout

    @property
    def served_model(self) -> str:
        return self.faults.wrong_model or self.cfg.model

    def set_faults(self, faults: Faults) -> None:
        self.faults = faults
        if faults.hang:
            self.unhung.clear()
        else:
            self.unhung.set()
        if faults.stall_body:
            self.unstalled.clear()
        else:
            self.unstalled.set()

    def should_error(self) -> bool:
        rate = self.faults.error_rate
        return rate > 0 and self.rng.random() < rate

    def descriptor(self, prompt_tokens: int) -> dict[str, Any]:
        n_blocks = max(1, -(-prompt_tokens // self.cfg.block_size))
        blocks = self.kv.allocate(n_blocks, time.monotonic())
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_block_ids": blocks,
            "remote_host": self.cfg.descriptor_host,
            "remote_port": self.cfg.port,
            "tp_size": 1,
            "kv_layout": self.kv_layout,
        }

    def serve_pull(self, engine_id: Any, block_ids: Any, kv_layout: Any) -> str | None:
        """Producer side of a KV pull; returns an error message or None when served."""
        ids = flat_block_ids(block_ids)
        if engine_id != self.engine_id:
            err: str | None = f"unknown engine id {engine_id!r} (this engine is {self.engine_id})"
        elif kv_layout != self.kv_layout:
            err = f"incompatible KV layout {kv_layout!r} (producer layout {self.kv_layout!r})"
        elif ids is None:
            err = "malformed block ids"
        elif not self.kv.take(ids, time.monotonic()):
            err = "KV blocks unknown or expired"
        else:
            err = None
        if err is None:
            self.stats.kv_pulls_served += 1
        else:
            self.stats.kv_pulls_refused += 1
        return err
