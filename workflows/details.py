"""What the Temporal UI shows in "Current Details" (and the CLI prints): short lines that fit the
narrow panel at 1400×1000 — one line per engine, a header line with the progress, human UTC times
and durations. Pure functions of the progress documents (no workflow APIs), so workflow code and
the CLI share them and tests pin them.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from narwhal_models.restart import FINAL_STEPS, EngineProgress, OperatorEvent

# Which recorded step durations make up each phase an operator talks about.
PHASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("drained", ("draining", "waiting_to_stop", "awaiting_approval")),
    ("restarted", ("restarting", "waiting_for_new_process")),
    ("readmitted", ("readmitting", "confirming")),
)
STEP_WORDS = {
    "pending": "pending",
    "draining": "draining",
    "waiting_to_stop": "waiting until safe to stop",
    "awaiting_approval": "waiting for operator (approve)",
    "restarting": "restarting",
    "waiting_for_new_process": "waiting for the new process",
    "readmitting": "readmitting",
    "confirming": "confirming it serves",
    "blocked": "blocked — waiting for operator",
    "done": "done",
    "aborted": "aborted",
    "failed": "failed",
    "refused": "refused",
}


def utc_time(ts: float | None) -> str:
    """``08:31:02 UTC`` (the header gives the date)."""
    if ts is None:
        return "—"
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S UTC")


def utc_datetime(ts: float | None) -> str:
    if ts is None:
        return "—"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(seconds: float) -> str:
    """``3.2 s``, ``1 m 12 s``, ``2 h 5 m``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        m, s = divmod(round(seconds), 60)
        return f"{m} m {s} s"
    h, rest = divmod(round(seconds), 3600)
    return f"{h} h {rest // 60} m"


RUNNING_WORDS = {"drained": "draining", "restarted": "restarting", "readmitted": "readmitting"}
NOUNS = {"drained": "drain", "restarted": "restart", "readmitted": "readmission"}


def _last_phase(e: EngineProgress) -> int:
    """Index in PHASES of the phase the engine is in (or ended in); -1 before the first."""
    reached = [
        n for n, (_, steps) in enumerate(PHASES) if any(s in e.step_times or s in e.timings for s in steps)
    ]
    current = [n for n, (_, steps) in enumerate(PHASES) if e.step in steps]
    return max(current + reached, default=-1)


def phase_durations(e: EngineProgress, now: float | None = None) -> list[str]:
    """``drained in 3.2 s``, ``restarted in 5.1 s`` … for the phases that took time (the running
    step counts up to ``now``). Only a finished phase says it happened: the phase an engine was
    in when it was aborted or failed says so (``restart aborted after 3.1 s``)."""
    spent = dict(e.timings)
    if now is not None and e.step_started_at is not None and e.step not in FINAL_STEPS:
        spent[e.step] = spent.get(e.step, 0.0) + max(0.0, now - e.step_started_at)
    last = _last_phase(e)
    ended = e.outcome in ("aborted", "failed", "refused")
    out = []
    for n, (word, steps) in enumerate(PHASES):
        total = sum(spent.get(s, 0.0) for s in steps)
        if not any(s in spent for s in steps):
            continue
        if e.step in steps:
            out.append(f"{RUNNING_WORDS[word]} for {duration(total)}")
        elif ended and n == last:
            out.append(f"{NOUNS[word]} {e.outcome} after {duration(total)}")
        else:
            out.append(f"{word} in {duration(total)}")
    return out


def outcome_words(e: EngineProgress) -> str:
    """What really happened to the engine, in two or three words: ``restarted``, ``not restarted``,
    ``restart aborted``, ``restarted, not readmitted`` …"""
    if e.outcome == "restarted":
        return "restarted"
    if e.outcome in ("pending", "running"):
        return "not restarted" if e.outcome == "pending" else STEP_WORDS.get(e.step, e.step)
    last = _last_phase(e)
    held = " (held out of placement)" if last >= 0 else ""
    if last <= 0:
        return f"not restarted{held}"
    if last == 1 and e.new_process_start is None:
        return f"restart {e.outcome}{held}"
    return f"restarted, readmission {e.outcome}{held}"


def checks_text(e: EngineProgress) -> str:
    """``7 checks passed``; on a refused readmission ``3 checks passed, then one failed``."""
    if not e.checks:
        return "no check passed" if e.step == "blocked" and e.error else ""
    failed = ", then one failed" if e.step in ("blocked", "failed", "aborted") and e.error else ""
    return f"{len(e.checks)} checks passed{failed}"


def engine_line(e: EngineProgress, now: float | None = None) -> str:
    """One Markdown list line: ``**e0** done · router active · drained in 3.2 s, … · 7 checks
    passed · 08:31:02–08:31:14 UTC``."""
    parts = [f"**{e.iid}** {STEP_WORDS.get(e.step, e.step)}"]
    if e.outcome in ("aborted", "failed", "refused"):
        parts[0] += f": {outcome_words(e)}"
    if e.router_state:
        parts.append(f"router {e.router_state}")
    if e.build:
        parts.append(f"build {e.build}")
    phases = phase_durations(e, now)
    if phases:
        parts.append(", ".join(phases))
    checks = checks_text(e)
    if checks:
        parts.append(checks)
    if e.started_at is not None:
        span = utc_time(e.started_at)
        if e.finished_at is not None:
            span += "–" + utc_time(e.finished_at)
        elif e.step_started_at is not None and e.step != "pending":
            span = f"{STEP_WORDS.get(e.step, e.step)} since {utc_time(e.step_started_at)}"
        parts.append(span)
    line = " · ".join(parts)
    if e.waiting_for:
        line += f" · **waiting for operator: {e.waiting_for}**"
    why = e.error or e.note
    if why:
        line += f" — {why}"
    return "- " + line.replace("|", "/")


def progress_line(engines: Iterable[EngineProgress], started_at: float | None, now: float) -> str:
    """``2/8 restarted, e3 draining, 1 m 12 s elapsed``."""
    es = list(engines)
    done = sum(1 for e in es if e.outcome == "restarted")
    active = [f"{e.iid} {STEP_WORDS.get(e.step, e.step)}" for e in es if e.outcome == "running"]
    parts = [f"{done}/{len(es)} restarted", *active]
    if started_at is not None:
        parts.append(f"{duration(max(0.0, now - started_at))} elapsed")
    return ", ".join(parts)


def event_line(ev: OperatorEvent) -> str:
    who = f" by {ev.by}" if ev.by else ""
    what = ev.kind.replace("_", " ")
    target = f" {ev.iid}" if ev.iid else ""
    detail = f": {ev.detail}" if ev.detail else ""
    return f"{utc_time(ev.at)} {what}{target}{who}{detail}"


def render(
    title: str,
    state: str,
    engines: Iterable[EngineProgress],
    started_at: float | None,
    now: float,
    message: str = "",
    events: Iterable[OperatorEvent] = (),
) -> str:
    """The whole Current Details text."""
    es = list(engines)
    lines = [f"### {title} — {state.replace('_', ' ')}", "", f"**{progress_line(es, started_at, now)}**"]
    if started_at is not None:
        lines[-1] += f" (started {utc_datetime(started_at)})"
    if message:
        lines += ["", message]
    lines += ["", *(engine_line(e, now) for e in es)]
    recent = list(events)[-3:]
    if recent:
        lines += ["", "Operator: " + "; ".join(event_line(ev) for ev in recent)]
    return "\n".join(lines)
