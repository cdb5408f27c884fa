"""``--analysis FILE``: the canary-analysis policy read from JSON or YAML (workflows/analysis.py).

A bad file is a one-line error naming the file and the key (``PreflightError``), before anything
is started or drained.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from narwhal_models.evidence import AnalysisPolicy
from workflows.preflight import PreflightError


def read_policy(path: str) -> AnalysisPolicy:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PreflightError(f"--analysis {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as exc:
        raise PreflightError(f"--analysis {path}: not JSON or YAML ({type(exc).__name__})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PreflightError(f"--analysis {path}: must hold a mapping of policy keys")
    try:
        return AnalysisPolicy.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(document)"
        raise PreflightError(f"--analysis {path}: {where}: {first['msg']}") from None


def policy_summary(p: AnalysisPolicy) -> str:
    return (
        f"bake {p.bake_s:g} s, {p.samples} sample(s) of {p.interval_s:g} s, ≥ {p.min_requests} legs each, "
        f"failure rate + {p.max_failure_rate_margin:.1%}, TTFT ×{p.max_ttft_ratio:g} / TPOT ×{p.max_tpot_ratio:g} "
        f"at p{p.percentile * 100:g}, failure limit {p.failure_limit}, inconclusive limit {p.inconclusive_limit}"
    )
