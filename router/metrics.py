"""Prometheus exposition (``narwhal.metrics`` v2) through ``prometheus_client``: counters, gauges,
latency histograms.

The hot path never touches ``prometheus_client``: serving bumps plain integers on the event loop
(``Counters``, ``ServingStats``, the breaker's tallies) and ``RouterCollector`` reads them into
metric families per scrape, so there is no lock per request. ``prometheus_client`` writes the text
(label values escaped, ``# HELP``/``# TYPE`` on every family).

Extensible: append a ``MetricSource`` to ``MetricsRenderer.extra_metric_sources``; it is called per
scrape and returns metric families (``prometheus_client.core.*MetricFamily``) or complete text
exposition lines (``# HELP``/``# TYPE`` included), which are parsed with ``prometheus_client``'s
parser and re-emitted.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from router.core import RouterCore
from router.counters import EXPIRED_REASONS, FAILED_REASONS, REJECTED_REASONS

if TYPE_CHECKING:
    from router.breaker import Breaker

log = logging.getLogger("narwhal.metrics")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
E2E_BUCKETS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

MetricSource = Callable[[], Iterable[Metric | str]]


class Histogram:
    """A lock-free latency histogram (observed on the event loop, read per scrape)."""

    __slots__ = ("bounds", "buckets", "count", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.buckets = [0] * (len(bounds) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.buckets[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, cumulative count)`` per bucket, ``+Inf`` last."""
        out: list[tuple[str, float]] = []
        acc = 0
        for bound, n in zip(self.bounds, self.buckets, strict=False):
            acc += n
            out.append((str(bound), acc))  # le="0.005", le="1.0": as before
        out.append(("+Inf", self.count))
        return out

    def family(self, name: str, help_: str) -> HistogramMetricFamily:
        return HistogramMetricFamily(name, help_, buckets=self.cumulative(), sum_value=self.total)


class ServingStats:
    """Process-local serving statistics (not handed off)."""

    def __init__(self) -> None:
        self.ttft = Histogram(TTFT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.inflight = 0
        self.queued = 0  # requests waiting in the admission queue (serving.queue_capacity)


def gauge(name: str, help_: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_, value=value)


def labelled(
    kind: type[GaugeMetricFamily] | type[CounterMetricFamily],
    name: str,
    help_: str,
    labels: list[str],
    rows: Iterable[tuple[list[str], float]],
) -> GaugeMetricFamily | CounterMetricFamily:
    family = kind(name, help_, labels=labels)
    for values, value in rows:
        family.add_metric(values, value)
    return family


def _reasoned(name: str, help_: str, known: Iterable[str], seen: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, help_, labels=["reason"])
    for reason in sorted(set(known) | set(seen)):
        family.add_metric([reason], seen.get(reason, 0))
    return family


def families_from_text(lines: Iterable[str]) -> Iterator[Metric]:
    """Text exposition lines → families (``prometheus_client``'s parser)."""
    yield from text_string_to_metric_families("\n".join(lines) + "\n")


class RouterCollector(Collector):
    """Reads the router's counters into metric families at scrape time."""

    def __init__(self, renderer: MetricsRenderer) -> None:
        self.renderer = renderer

    def collect(self) -> Iterator[Metric]:
        r = self.renderer
        core, stats = r.core, r.stats
        c = core.counters.values
        reasons = core.counters.reasons
        yield InfoMetricFamily(
            "narwhal_contract", "Metrics contract served here.", value={"contract": "metrics", "version": "2"}
        )
        # unserved / unsized_offered are not exported: never counted (router/config_keys.py)
        for key in ("offered", "served", "cancelled", "invalid_requests", "slo_met"):
            yield CounterMetricFamily(f"narwhal_{key}_total", f"Requests counted as {key}.", value=c[key])
        yield _reasoned(
            "narwhal_failed_total", "Failed requests by reason.", FAILED_REASONS, reasons["failed"]
        )
        yield _reasoned(
            "narwhal_rejected_total", "Rejected requests by reason.", REJECTED_REASONS, reasons["rejected"]
        )
        yield _reasoned(
            "narwhal_expired_total", "Expired requests by reason.", EXPIRED_REASONS, reasons["expired"]
        )
        yield gauge("narwhal_inflight_requests", "Requests holding an in-flight seat.", stats.inflight)
        yield gauge("narwhal_queued_requests", "Requests waiting for an in-flight seat.", stats.queued)
        yield gauge("narwhal_router_ready", "1 when /ready answers 200.", int(core.ready()))
        yield gauge(
            "narwhal_router_lease_epoch", "Current lease epoch (0 without a lease).", core.control.epoch
        )
        yield from self._engines()
        yield from core.engine_stats.families()
        yield from core.journal.families()
        yield stats.ttft.family("narwhal_ttft_seconds", "Time to first token of served requests.")
        yield stats.e2e.family("narwhal_e2e_seconds", "End-to-end duration of served requests.")
        for source in r.extra_metric_sources:
            items = list(source())
            lines = [i for i in items if isinstance(i, str)]
            yield from (i for i in items if not isinstance(i, str))
            if lines:
                yield from families_from_text(lines)

    def _engines(self) -> Iterator[Metric]:
        sched = self.renderer.core.scheduler
        ids = list(sched.engines)
        yield labelled(
            GaugeMetricFamily,
            "narwhal_engine_resident",
            "Requests the router tracks on an engine, per phase.",
            ["iid", "phase"],
            [
                row
                for iid, e in sched.engines.items()
                for row in (([iid, "prefill"], e.resident_prefill), ([iid, "decode"], e.resident_decode))
            ],
        )
        yield labelled(
            GaugeMetricFamily,
            "narwhal_engine_ejected",
            "1 while the breaker has the engine ejected.",
            ["iid"],
            [([iid], int(iid in sched.ejected)) for iid in ids],
        )
        yield labelled(
            GaugeMetricFamily,
            "narwhal_engine_held",
            "1 while the breaker holds the engine (inference suspect).",
            ["iid"],
            [([iid], int(iid in sched.held)) for iid in ids],
        )
        yield labelled(
            GaugeMetricFamily,
            "narwhal_engine_accepts_new",
            "1 when the engine is placement-eligible.",
            ["iid"],
            [([iid], int(sched.accepts_new(iid))) for iid in ids],
        )
        b = self.renderer.breaker
        if b is None:
            return
        yield labelled(
            CounterMetricFamily,
            "narwhal_engine_ejections_total",
            "Ejections by engine and cause.",
            ["iid", "cause"],
            [([iid, cause], n) for (iid, cause), n in sorted(b.ejections.items())],
        )
        yield labelled(
            CounterMetricFamily,
            "narwhal_engine_readmissions_total",
            "Readmissions after an ejection.",
            ["iid"],
            [([iid], b.readmissions.get(iid, 0)) for iid in ids],
        )
        yield labelled(
            CounterMetricFamily,
            "narwhal_engine_ejections_spared_total",
            "Ejections refused: last engine of a role.",
            ["iid", "cause"],
            [([iid, cause], n) for (iid, cause), n in sorted(b.spared.items())],
        )
        yield labelled(
            CounterMetricFamily,
            "narwhal_engine_probes_total",
            "Breaker probes by kind and outcome.",
            ["iid", "kind", "outcome"],
            [([iid, kind, outcome], n) for (iid, kind, outcome), n in sorted(b.probes.items())],
        )


class MetricsRenderer:
    def __init__(self, core: RouterCore, stats: ServingStats, breaker: Breaker | None = None) -> None:
        self.core = core
        self.stats = stats
        self.breaker = breaker
        self.extra_metric_sources: list[MetricSource] = []
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(RouterCollector(self))

    def render(self) -> str:
        return generate_latest(self.registry).decode()
