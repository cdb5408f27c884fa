"""One request's record: exactly one terminal outcome → counters, latency stats and one journal row."""

from __future__ import annotations

from typing import Any

from router.core import RouterCore
from router.counters import Outcome
from router.metrics import ServingStats

# outcome -> journal ``terminal`` value
_TERMINAL: dict[str, str] = {
    "served": "completed",
    "failed": "failed",
    "rejected": "rejected",
    "cancelled": "cancelled",
    "expired": "expired",
    "invalid_requests": "invalid",
    "refused": "refused",
}


class RequestRecord:
    __slots__ = (
        "arrived",
        "attempt_failures",
        "attempts",
        "cancelled_phase",
        "client_rid",
        "decode_iid",
        "decode_opened_at",
        "engine_rid",
        "error",
        "error_code",
        "error_type",
        "extra",
        "first_token_at",
        "input_len",
        "outcome",
        "output_len",
        "prefill_iid",
        "reason",
        "rid",
        "started",
        "status",
        "stream",
    )

    def __init__(self, rid: str, arrived: float) -> None:
        self.rid = rid
        self.arrived = arrived
        self.client_rid: str | None = None
        self.engine_rid: str | None = None  # the x-request-id the engine legs carried
        self.outcome: str = ""
        self.reason = ""
        self.status = 0
        self.error = ""
        self.error_type: str | None = None
        self.error_code: str | None = None
        self.prefill_iid: str | None = None
        self.decode_iid: str | None = None
        self.decode_opened_at: float | None = None  # when the decode leg was asked for (evidence)
        self.attempts = 0
        self.attempt_failures: list[str] = []
        self.first_token_at: float | None = None
        self.output_len = 0
        self.input_len: int | None = None
        self.started = False  # output reached the client (no retry from here on)
        self.stream: bool | None = None
        self.cancelled_phase = ""
        self.extra: dict[str, Any] | None = None


def finish(
    core: RouterCore,
    stats: ServingStats,
    rec: RequestRecord,
    outcome: Outcome,
    reason: str = "",
    status: int = 200,
    error: str = "",
    error_type: str | None = None,
    error_code: str | None = None,
) -> bool:
    """Settle ``rec`` once: counter, histograms, journal row. Later calls are ignored (False)."""
    if rec.outcome:
        return False
    rec.outcome = outcome
    rec.reason = reason
    rec.status = status
    rec.error = error
    rec.error_type = error_type
    rec.error_code = error_code
    core.counters.finish(outcome, reason)
    now = core.clock.monotonic()
    duration = now - rec.arrived
    ttft = rec.first_token_at - rec.arrived if rec.first_token_at is not None else None
    tpot: float | None = None
    if rec.first_token_at is not None and rec.output_len > 1:
        tpot = (now - rec.first_token_at) / (rec.output_len - 1)
    if outcome == "served":
        opened = rec.decode_opened_at
        first = rec.first_token_at - opened if rec.first_token_at is not None and opened is not None else None
        core.engine_stats.decode_served(rec.decode_iid, first, tpot)
        stats.e2e.observe(duration)
        if ttft is not None:
            stats.ttft.observe(ttft)
        slo = core.config.slo
        if slo is not None and ttft is not None and ttft <= slo.ttft_s and (tpot or 0.0) <= slo.tpot_s:
            core.counters.values["slo_met"] += 1
    row: dict[str, Any] = {
        "rid": rec.rid,
        "client_rid": rec.client_rid,
        "engine_rid": rec.engine_rid,
        "arrived": rec.arrived,
        "input_len": rec.input_len,
        "output_len": rec.output_len,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "duration_s": duration,
        "attempts": rec.attempts,
        "attempt_failures": rec.attempt_failures,
        "prefill_iid": rec.prefill_iid,
        "decode_iid": rec.decode_iid,
        "crossed": rec.prefill_iid is not None and rec.decode_iid not in (None, rec.prefill_iid),
        "stream": rec.stream,
        # a buffered answer's tokens are its usage.completion_tokens (the decode leg is not streamed)
        "token_accounting": "usage" if rec.stream is False else "token_ids",
        "error": error,
        "status": status,
        "error_type": error_type,
        "error_code": error_code,
        "reason": reason,
        "terminal": _TERMINAL[outcome],
    }
    if outcome in ("rejected", "expired", "refused"):
        row[outcome] = True
    elif outcome == "cancelled":
        row["cancelled"] = True
        row["cancelled_phase"] = rec.cancelled_phase
    if rec.extra:
        row.update(rec.extra)
    core.journal.append(row)
    return True
