"""The canary analysis as people read it: one table row per sample (Current Details, ``status``).

Pure functions of the recorded samples (workflows/analysis.py), shared by the workflow and the CLI.
"""

from __future__ import annotations

from collections.abc import Sequence

from narwhal_models.evidence import Sample, Side

SHOWN = 6  # samples in Current Details (the progress document keeps more)


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v * 1000:.1f}"


def _rate(s: Side) -> str:
    return "—" if s.failure_rate is None else f"{s.failure_rate:.1%}"


def _ttft(s: Side) -> str:
    return "/".join(_ms(s.ttft_s.get(leg)) for leg in ("prefill", "decode"))


def sample_row(s: Sample) -> str:
    c, b = s.canary, s.baseline
    why = "; ".join(s.reasons) or "within limits"
    cells = [
        str(s.index),
        f"{', '.join(c.engines)} vs {', '.join(b.engines) or '(none)'}",
        f"**{s.verdict}**",
        f"{c.legs} vs {b.legs}",
        f"{_rate(c)} vs {_rate(b)}",
        f"{_ttft(c)} vs {_ttft(b)}",
        f"{_ms(c.tpot_s)} vs {_ms(b.tpot_s)}",
        why,
    ]
    return "| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |"


def analysis_table(samples: Sequence[Sample], shown: int = SHOWN) -> str:
    """A Markdown table of the last ``shown`` samples (restarted vs baseline), "" without any."""
    if not samples:
        return ""
    recent = list(samples)[-shown:]
    head = f"**Canary analysis** — restarted vs baseline, last {len(recent)} of {len(samples)} sample(s)"
    lines = [
        head,
        "",
        "| # | engines | verdict | legs | failed | TTFT ms (prefill/decode) | TPOT ms | why |",
        "|---|---|---|---|---|---|---|---|",
        *(sample_row(s) for s in recent),
    ]
    return "\n".join(lines)


def verdict_line(s: Sample) -> str:
    """One line per sample (timer summaries in the history, the run's message)."""
    why = "; ".join(s.reasons) or "within limits"
    return (
        f"sample {s.index} {', '.join(s.engines)}: {s.verdict} — {why} "
        f"(legs {s.canary.legs} vs {s.baseline.legs}, failed {_rate(s.canary)} vs {_rate(s.baseline)})"
    )
