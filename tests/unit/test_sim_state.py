"""Simulator internals without sockets: KV blocks, deterministic tokens, fault merging, parsing."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fleet.sim import openai as oai
from fleet.sim.config import Faults
from fleet.sim.state import KvStore, flat_block_ids, output_tokens, prompt_token_ids


def test_kv_store_take_once_and_expire() -> None:
    kv = KvStore(lease_s=60, capacity=4)
    a = kv.allocate(2, now=0.0)
    assert kv.take(a, now=1.0)
    assert not kv.take(a, now=1.0)  # handed over once
    b = kv.allocate(1, now=0.0)
    assert not kv.take(b, now=61.0)  # expired
    c = kv.allocate(5, now=100.0)  # bounded: oldest evicted
    assert len(kv) == 4
    assert not kv.take(c[:1], now=100.0)
    assert kv.take(c[1:], now=100.0)


def test_block_ids_flat_or_grouped() -> None:
    assert flat_block_ids([1, 2]) == [1, 2]
    assert flat_block_ids([[1, 2], [3]]) == [1, 2, 3]
    assert flat_block_ids([1, -1]) is None
    assert flat_block_ids([True]) is None
    assert flat_block_ids("x") is None


def test_tokens_are_deterministic() -> None:
    assert output_tokens(b"p", 0, 8) == output_tokens(b"p", 0, 8)
    assert output_tokens(b"p", 0, 8)[:3] == output_tokens(b"p", 0, 3)
    assert output_tokens(b"p", 0, 8) != output_tokens(b"q", 0, 8)
    assert output_tokens(b"p", 0, 8) != output_tokens(b"p", 1, 8)


def test_prompt_token_ids_are_deterministic_per_prompt() -> None:
    ids = prompt_token_ids(b"p", 4141)
    assert len(ids) == 4141 and all(type(i) is int and i >= 0 for i in ids)
    assert ids == prompt_token_ids(b"p", 4141)  # every engine reports the same ids for a prompt
    assert prompt_token_ids(b"p", 3) == ids[:3]
    assert prompt_token_ids(b"q", 8) != ids[:8]
    assert prompt_token_ids(b"p", 0) == []


def test_faults_merge_and_validate() -> None:
    f = Faults().merged({"slow_ms": 5, "error_rate": 1})
    assert (f.slow_ms, f.error_rate, f.hang) == (5.0, 1.0, False)
    assert f.merged({"hang": True}).slow_ms == 5.0
    for bad in ({"hang": 1}, {"error_rate": 2.0}, {"attestation": "maybe"}, {"nope": True}):
        with pytest.raises(ValidationError):
            Faults().merged(bad)


def test_request_kinds_and_validation() -> None:
    base = {"model": "m", "prompt": "hello"}
    assert oai.parse(base, chat=False).kind == "plain"
    assert oai.parse({**base, "kv_transfer_params": {"do_remote_decode": True}}, chat=False).kind == "prefill"
    assert oai.parse({**base, "kv_transfer_params": {"do_remote_prefill": True}}, chat=False).kind == "decode"
    assert oai.parse({**base}, chat=False).max_tokens == oai.DEFAULT_MAX_TOKENS
    chat = oai.parse({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 3}, chat=True)
    assert chat.max_tokens == 3
    for bad in ({"prompt": 3}, {**base, "max_tokens": "2"}, {**base, "max_tokens": 0}, {**base, "stream": 1}):
        with pytest.raises(oai.RequestError):
            oai.parse(bad, chat=False)
