"""The chaos drill's verdict and its one-screen summary (from the JSON report ``Drill.run`` returns)."""

from __future__ import annotations

from typing import Any


def passed(report: dict[str, Any]) -> bool:
    keys = ("duplicated_restarts", "holds_lost", "unattributed_failures")
    return all(int(report[k]) == 0 for k in keys)


def _wf_brief(w: dict[str, Any]) -> str:
    return f"{w['state']} {w['seconds']}s"


def summary_text(r: dict[str, Any]) -> str:
    c = r["client"]
    lines = [
        f"chaos drill seed {r['seed']}: {r['duration_s']} s, {r['engines']} engines, faults {','.join(r['faults_enabled'])}",
        f"client: {c['ok']} ok, {c['failed']} failed (by fault {c['failed_by_fault']}, by kind "
        f"{c['failed_by_kind']}), {c['masked_retries']} masked retries, p50 {c['p50_ms']} ms p99 {c['p99_ms']} ms",
        f"unattributed failures: {r['unattributed_failures']}",
        f"restarts completed: {r['restarts_completed']} over {len(r['workflows'])} workflows "
        f"({', '.join(_wf_brief(w) for w in r['workflows'])})",
        f"duplicated restarts: {r['duplicated_restarts']} (supervisor {r['supervisor_restarts']})",
        f"lifecycle holds lost: {r['holds_lost']} ({r['lifecycle_samples']} samples)",
        "faults: "
        + "; ".join(
            f"{f['kind']} {f['target']} at {f['at']:.1f}s → "
            + (f"recovered in {f['recovery_s']:.2f}s" if f["recovery_s"] is not None else "NOT recovered")
            for f in r["faults"]
        ),
        "PASS" if passed(r) else "FAIL",
    ]
    return "\n".join(lines)
