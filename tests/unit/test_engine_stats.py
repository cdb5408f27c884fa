"""Per-engine serving evidence (router/engine_stats.py): what is counted, how it is exposed.

The accounting is pure; tests/integration/test_restart_canary.py drives the real hooks (real
routers, simulated engines under client load) and reads them back through /metrics and
/narwhal/state.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
from prometheus_client.parser import text_string_to_metric_families

from router.engine_stats import TTFT_BUCKETS, EngineStats
from router.state import SCHEMA_PATH


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_legs_are_counted_per_engine_and_unknown_engines_are_ignored() -> None:
    st = EngineStats(["e0", "e1"])
    st.prefill_served("e0", 0.022)
    st.prefill_served("e0", 0.22)
    st.decode_served("e1", 0.004, 0.002)
    st.decode_served("e1", None, None)  # served, no timing known: counted, not observed
    st.leg_failed("e0", "prefill", "engine_error")
    st.leg_failed("e0", "prefill", "engine_error")
    st.leg_failed("e1", "decode", "engine_timeout")
    st.prefill_served("zz", 1.0)  # not configured: bounded cardinality
    st.leg_failed("zz", "decode", "engine_error")
    st.decode_served(None, 0.1, 0.1)
    snap = st.snapshot()
    assert set(snap) == {"e0", "e1"}
    p = snap["e0"].prefill
    assert (p.served, p.failed, p.ttft_s.count) == (2, {"engine_error": 2}, 2)
    assert p.ttft_s.counts[TTFT_BUCKETS.index(0.025)] == 1 and p.ttft_s.counts[TTFT_BUCKETS.index(0.25)] == 1
    assert abs(p.ttft_s.sum - 0.242) < 1e-9 and p.tpot_s is None
    d = snap["e1"].decode
    assert (d.served, d.failed, d.ttft_s.count) == (2, {"engine_timeout": 1}, 1)
    assert d.tpot_s is not None and d.tpot_s.count == 1
    assert len(p.ttft_s.counts) == len(p.ttft_s.bounds) + 1


def test_metrics_families_carry_the_engine_label() -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.registry import Collector

    st = EngineStats(["e0"])
    st.prefill_served("e0", 0.03)
    st.leg_failed("e0", "decode", "engine_error")

    class C(Collector):
        def collect(self):  # type: ignore[no-untyped-def]
            return st.families()

    reg = CollectorRegistry(auto_describe=False)
    reg.register(C())
    m = _samples(generate_latest(reg).decode())
    assert m[("narwhal_engine_leg_served_total", (("engine", "e0"), ("leg", "prefill")))] == 1
    assert m[("narwhal_engine_leg_served_total", (("engine", "e0"), ("leg", "decode")))] == 0
    key = (
        "narwhal_engine_leg_failed_total",
        (("engine", "e0"), ("leg", "decode"), ("reason", "engine_error")),
    )
    assert m[key] == 1
    le = (("engine", "e0"), ("le", "0.05"), ("leg", "prefill"))
    assert m[("narwhal_engine_ttft_seconds_bucket", le)] == 1
    assert m[("narwhal_engine_ttft_seconds_count", (("engine", "e0"), ("leg", "prefill")))] == 1
    assert ("narwhal_engine_tpot_seconds_count", (("engine", "e0"),)) in m


def test_state_schema_accepts_the_evidence_and_older_documents() -> None:
    schema = json.loads(Path(SCHEMA_PATH).read_text())
    ev = schema["properties"]["engine_evidence"]
    assert "engine_evidence" not in schema["required"]  # additive: older documents still validate
    st = EngineStats(["e0"])
    st.decode_served("e0", 0.01, 0.001)
    doc = {k: v.model_dump(mode="json") for k, v in st.snapshot().items()}
    jsonschema.validate(doc, {**ev, "$defs": schema["$defs"]})
