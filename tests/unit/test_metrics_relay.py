"""Metrics rendering and decode-chunk processing (pure)."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from narwhal_testing.metrics import Samples, parse_samples
from router.assemble import RouterOptions, build_parts
from router.clock import FakeClock
from router.config import parse_fleet
from router.core import RouterCore
from router.journal import Journal
from router.metrics import CONTENT_TYPE, Histogram
from router.serving.relay import StreamState, has_output, process_chunk

FLEET = {
    "model": "m",
    "engines": [{"iid": "e0", "url": "http://a", "role": "prefill"}, {"iid": "e1", "url": "http://b"}],
}


def core() -> RouterCore:
    return RouterCore(config=parse_fleet(FLEET), journal=Journal(None), clock=FakeClock())


def samples(text: str) -> Samples:
    return parse_samples(text)


def test_every_known_reason_is_emitted_from_zero() -> None:
    c = core()
    parts = build_parts(c, RouterOptions())
    s = samples(parts.metrics.render())
    assert s["narwhal_offered_total"] == 0
    assert s['narwhal_failed_total{reason="engine_timeout"}'] == 0
    assert s['narwhal_failed_total{reason="no_engine"}'] == 0
    assert s['narwhal_rejected_total{reason="not_ready"}'] == 0
    assert s['narwhal_rejected_total{reason="inflight_limit"}'] == 0
    assert s['narwhal_expired_total{reason="deadline"}'] == 0
    assert s["narwhal_router_ready"] == 1
    assert s["narwhal_router_lease_epoch"] == 0
    assert s['narwhal_engine_resident{iid="e0",phase="prefill"}'] == 0
    assert s['narwhal_engine_ejected{iid="e1"}'] == 0
    assert s['narwhal_engine_readmissions_total{iid="e1"}'] == 0
    assert s['narwhal_ttft_seconds_bucket{le="+Inf"}'] == 0
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")


def test_counters_ejections_and_extra_sources_render() -> None:
    c = core()
    parts = build_parts(c, RouterOptions())
    c.counters.offer()
    c.counters.finish("failed", "engine_error")
    c.scheduler.engines["e0"].resident_prefill = 2
    parts.breaker.eject("e1", "connection")
    parts.metrics.extra_metric_sources.append(lambda: ["# TYPE narwhal_x gauge", "narwhal_x 7"])
    parts.stats.ttft.observe(0.02)
    s = samples(parts.metrics.render())
    assert s['narwhal_failed_total{reason="engine_error"}'] == 1
    assert s['narwhal_engine_resident{iid="e0",phase="prefill"}'] == 2
    assert s['narwhal_engine_ejected{iid="e1"}'] == 1
    assert s['narwhal_engine_ejections_total{iid="e1",cause="connection"}'] == 1
    assert s["narwhal_x"] == 7
    assert s['narwhal_ttft_seconds_bucket{le="0.01"}'] == 0
    assert s['narwhal_ttft_seconds_bucket{le="0.025"}'] == 1
    assert s["narwhal_ttft_seconds_count"] == 1


def test_histogram_buckets_are_cumulative() -> None:
    h = Histogram((1.0, 2.0))
    for v in (0.5, 1.0, 1.5, 9.0):
        h.observe(v)
    buckets = {s.labels["le"]: s.value for s in h.family("h", "help").samples if s.name == "h_bucket"}
    assert buckets["1.0"] == 2 and buckets["2.0"] == 3 and buckets["+Inf"] == 4
    assert samples(generate_latest(_Fixed(h.family("h", "help"))).decode())['h_bucket{le="2.0"}'] == 3


class _Fixed(CollectorRegistry):
    """A registry that serves the given families (for rendering one family in a test)."""

    def __init__(self, *families: Metric) -> None:
        super().__init__(auto_describe=False)
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def test_label_values_are_escaped_and_every_family_is_typed() -> None:
    # engine ids are held to [A-Za-z0-9._-] (router/ids.py); free text reaches labels as the cause
    fleet = {
        "model": "m",
        "engines": [{"iid": "e0", "url": "http://a", "role": "prefill"}, {"iid": "e1", "url": "http://b"}],
    }
    c = RouterCore(config=parse_fleet(fleet), journal=Journal(None), clock=FakeClock())
    parts = build_parts(c, RouterOptions())
    cause = 'cause "quoted" \\x\nz'
    parts.breaker.eject("e0", cause)
    text = parts.metrics.render()
    assert 'narwhal_engine_ejected{iid="e0"} 1.0' in text
    assert 'cause="cause \\"quoted\\" \\\\x\\nz"' in text
    parsed = {s.labels.get("cause") for f in text_string_to_metric_families(text) for s in f.samples}
    assert cause in parsed  # the escaped text reads back to the cause
    families = [ln.split()[2] for ln in text.splitlines() if ln.startswith("# HELP ")]
    typed = {ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE ")}
    assert families and set(families) == typed
    assert "# TYPE narwhal_contract_info gauge" in text
    assert samples(text)['narwhal_contract_info{contract="metrics",version="2"}'] == 1


def _chunk(**kw: object) -> bytes:
    return orjson.dumps(kw)


def test_chunk_strips_engine_fields_unless_asked() -> None:
    st = StreamState()
    raw = _chunk(
        id="x",
        choices=[{"index": 0, "text": " a", "token_ids": [5, 6], "prompt_token_ids": [1, 2, 3]}],
        prompt_token_ids=[1, 2, 3],
    )
    out, n = process_chunk(raw, st, want_ids=False)
    assert n == 2 and st.prompt_tokens == 3
    doc = orjson.loads(out)
    assert "prompt_token_ids" not in doc and "token_ids" not in doc["choices"][0]
    st2 = StreamState()
    out2, _ = process_chunk(raw, st2, want_ids=True)
    assert out2 is raw  # untouched bytes are relayed as they came


@pytest.mark.parametrize(
    ("choice", "tokens"),
    [
        ({"delta": {"role": "assistant", "content": ""}}, 0),  # vLLM's first chat chunk: no output
        ({"delta": {"content": "Hel"}}, 1),
        ({"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}}, 1),
        ({"delta": {"reasoning_content": "hmm"}}, 1),
        ({"delta": {}, "finish_reason": "tool_calls"}, 0),
        ({"text": " a"}, 1),
        ({"text": ""}, 0),
        ({"delta": {"content": "x"}, "token_ids": [4, 5]}, 2),  # token ids count when present
    ],
)
def test_output_of_any_kind_counts_as_a_token(choice: dict[str, object], tokens: int) -> None:
    """A tool-call or reasoning stream has no ``content``: its deltas are output all the same (the
    first one is the first token); a role-only chunk or a usage chunk is not."""
    st = StreamState()
    _, n = process_chunk(_chunk(id="c", choices=[{"index": 0, **choice}]), st, want_ids=True)
    assert n == tokens and st.tokens == tokens
    if "token_ids" not in choice:
        assert has_output(choice) is (tokens > 0)
    _, n = process_chunk(_chunk(id="c", choices=[], usage={"completion_tokens": 3}), st, want_ids=True)
    assert n == 0 and st.usage == {"completion_tokens": 3}
