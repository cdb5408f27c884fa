"""Prometheus text exposition (``narwhal.metrics`` v2): counters, gauges, latency histograms.

Extensible: append a ``Callable[[], Iterable[str]]`` to ``MetricsRenderer.extra_metric_sources``;
each returns complete exposition lines (``# HELP``/``# TYPE`` included) and is called per scrape.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from router.core import RouterCore
from router.counters import EXPIRED_REASONS, FAILED_REASONS, REJECTED_REASONS

if TYPE_CHECKING:
    from router.breaker import Breaker

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
E2E_BUCKETS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class Histogram:
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

    def render(self, name: str, help_: str) -> list[str]:
        out = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        acc = 0
        for bound, n in zip(self.bounds, self.buckets, strict=False):
            acc += n
            out.append(f'{name}_bucket{{le="{bound}"}} {acc}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{name}_sum {self.total}")
        out.append(f"{name}_count {self.count}")
        return out


class ServingStats:
    """Process-local serving statistics (not handed off)."""

    def __init__(self) -> None:
        self.ttft = Histogram(TTFT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.inflight = 0
        self.queued = 0  # requests waiting in the admission queue (serving.queue_capacity)


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _family(name: str, kind: str, help_: str) -> list[str]:
    return [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]


def _reasoned(name: str, help_: str, known: Iterable[str], seen: dict[str, int]) -> list[str]:
    out = _family(name, "counter", help_)
    for reason in sorted(set(known) | set(seen)):
        out.append(f'{name}{{reason="{_esc(reason)}"}} {seen.get(reason, 0)}')
    return out


class MetricsRenderer:
    def __init__(self, core: RouterCore, stats: ServingStats, breaker: Breaker | None = None) -> None:
        self.core = core
        self.stats = stats
        self.breaker = breaker
        self.extra_metric_sources: list[Callable[[], Iterable[str]]] = []

    def render(self) -> str:
        core = self.core
        c = core.counters.values
        reasons = core.counters.reasons
        out = ['narwhal_contract_info{contract="metrics",version="2"} 1']
        for key in ("offered", "served", "cancelled", "invalid_requests", "unserved", "slo_met"):
            out += _family(f"narwhal_{key}_total", "counter", f"Requests counted as {key}.")
            out.append(f"narwhal_{key}_total {c[key]}")
        out += _reasoned(
            "narwhal_failed_total", "Failed requests by reason.", FAILED_REASONS, reasons["failed"]
        )
        out += _reasoned(
            "narwhal_rejected_total", "Rejected requests by reason.", REJECTED_REASONS, reasons["rejected"]
        )
        out += _reasoned(
            "narwhal_expired_total", "Expired requests by reason.", EXPIRED_REASONS, reasons["expired"]
        )
        out += _family("narwhal_inflight_requests", "gauge", "Requests holding an in-flight seat.")
        out.append(f"narwhal_inflight_requests {self.stats.inflight}")
        out += _family("narwhal_queued_requests", "gauge", "Requests waiting for an in-flight seat.")
        out.append(f"narwhal_queued_requests {self.stats.queued}")
        out += _family("narwhal_router_ready", "gauge", "1 when /ready answers 200.")
        out.append(f"narwhal_router_ready {int(core.ready())}")
        out += _family("narwhal_router_lease_epoch", "gauge", "Current lease epoch (0 without a lease).")
        out.append(f"narwhal_router_lease_epoch {core.control.epoch}")
        out += self._engines()
        out += self.stats.ttft.render("narwhal_ttft_seconds", "Time to first token of served requests.")
        out += self.stats.e2e.render("narwhal_e2e_seconds", "End-to-end duration of served requests.")
        for source in self.extra_metric_sources:
            out.extend(source())
        out.append("")
        return "\n".join(out)

    def _engines(self) -> list[str]:
        sched = self.core.scheduler
        out = _family(
            "narwhal_engine_resident", "gauge", "Requests the router tracks on an engine, per phase."
        )
        for iid, e in sched.engines.items():
            out.append(f'narwhal_engine_resident{{iid="{iid}",phase="prefill"}} {e.resident_prefill}')
            out.append(f'narwhal_engine_resident{{iid="{iid}",phase="decode"}} {e.resident_decode}')
        out += _family("narwhal_engine_ejected", "gauge", "1 while the breaker has the engine ejected.")
        out += [f'narwhal_engine_ejected{{iid="{iid}"}} {int(iid in sched.ejected)}' for iid in sched.engines]
        out += _family(
            "narwhal_engine_held", "gauge", "1 while the breaker holds the engine (inference suspect)."
        )
        out += [f'narwhal_engine_held{{iid="{iid}"}} {int(iid in sched.held)}' for iid in sched.engines]
        out += _family("narwhal_engine_accepts_new", "gauge", "1 when the engine is placement-eligible.")
        out += [
            f'narwhal_engine_accepts_new{{iid="{iid}"}} {int(sched.accepts_new(iid))}'
            for iid in sched.engines
        ]
        b = self.breaker
        if b is None:
            return out
        out += _family("narwhal_engine_ejections_total", "counter", "Ejections by engine and cause.")
        for (iid, cause), n in sorted(b.ejections.items()):
            out.append(f'narwhal_engine_ejections_total{{iid="{iid}",cause="{_esc(cause)}"}} {n}')
        out += _family("narwhal_engine_readmissions_total", "counter", "Readmissions after an ejection.")
        out += [
            f'narwhal_engine_readmissions_total{{iid="{iid}"}} {b.readmissions.get(iid, 0)}'
            for iid in sched.engines
        ]
        out += _family(
            "narwhal_engine_ejections_spared_total", "counter", "Ejections refused: last engine of a role."
        )
        for (iid, cause), n in sorted(b.spared.items()):
            out.append(f'narwhal_engine_ejections_spared_total{{iid="{iid}",cause="{_esc(cause)}"}} {n}')
        out += _family("narwhal_engine_probes_total", "counter", "Breaker probes by kind and outcome.")
        for (iid, kind, outcome), n in sorted(b.probes.items()):
            out.append(f'narwhal_engine_probes_total{{iid="{iid}",kind="{kind}",outcome="{outcome}"}} {n}')
        return out
