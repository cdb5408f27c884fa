"""An engine process's identity from its ``/metrics``: one parser, one equality rule.

Used by every reader of engine metrics: the router's control client (identity capture, monitor,
readmission), the supervisor (``if_process_start`` guard) and the restart activities (waiting for a
newer process). ``process_start_time_seconds`` is read with ``prometheus_client``'s text parser: the
first sample of that name (any labels) must be finite and positive (spec §6.4).

Two readings name the same process when they differ by at most ``SAME_PROCESS_TOLERANCE_S``:
a process start is a wall-clock float that passes through JSON and text exposition, so the rule
absorbs formatting only, never a restart (processes do not restart within a microsecond).
"""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

METRIC = "process_start_time_seconds"
SAME_PROCESS_TOLERANCE_S = 1e-6


class ProcessStartError(ValueError):
    """The metrics text has no usable ``process_start_time_seconds`` (the message says why)."""


def read_process_start(metrics_text: str) -> float:
    """The process start in ``metrics_text``; ``ProcessStartError`` when missing or unusable."""
    try:
        for family in text_string_to_metric_families(metrics_text):
            for sample in family.samples:
                if sample.name == METRIC:
                    return _usable(float(sample.value))
    except ProcessStartError:
        raise
    except (ValueError, TypeError, IndexError) as exc:
        raise ProcessStartError(f"/metrics is not Prometheus text: {exc}") from None
    raise ProcessStartError(f"no {METRIC} in /metrics")


def process_start_or_none(metrics_text: str) -> float | None:
    """``read_process_start``, or None when the text has no usable value."""
    try:
        return read_process_start(metrics_text)
    except ProcessStartError:
        return None


def same_process(a: float | None, b: float | None) -> bool:
    """True when both readings exist and name the same process."""
    return a is not None and b is not None and abs(a - b) <= SAME_PROCESS_TOLERANCE_S


def newer_process(live: float | None, old: float | None) -> bool:
    """True when ``live`` is a later process than ``old`` (not the same one, started after it)."""
    return live is not None and old is not None and live > old and not same_process(live, old)


def _usable(value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise ProcessStartError(f"{METRIC} must be finite and positive")
    return value
