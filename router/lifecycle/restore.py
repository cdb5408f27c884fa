"""Strict checks of a lifecycle section before it replaces live state (spec §2.4 step 6).

Pure: returns the validated section or raises ValueError naming what is wrong; nothing is mutated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from router.lifecycle.models import LifecycleSection


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "lifecycle"
    return f"lifecycle.{where}: {str(err['msg']).removeprefix('Value error, ')}"


def checked_section(
    section: LifecycleSection | Mapping[str, Any], engine_ids: Sequence[str], policy: str
) -> LifecycleSection:
    if isinstance(section, LifecycleSection):
        data: Any = section.model_dump()
    elif isinstance(section, Mapping):
        data = dict(section)
    else:
        raise ValueError("lifecycle section must be an object")
    try:
        sec = LifecycleSection.model_validate(data)
    except ValidationError as exc:
        raise ValueError(_first_error(exc)) from None
    configured = set(engine_ids)
    if sec.engine_restart_policy != policy:
        raise ValueError("handoff engine restart policy mismatch")
    unknown_starts = sorted(set(sec.process_starts) - configured)
    if unknown_starts:
        raise ValueError(f"lifecycle.process_starts names unknown engine(s): {', '.join(unknown_starts)}")
    seen: set[str] = set()
    for rec in sec.records:
        if rec.iid not in configured:
            raise ValueError(f"lifecycle record for unknown engine {rec.iid}")
        if rec.iid in seen:
            raise ValueError(f"duplicate lifecycle record for {rec.iid}")
        seen.add(rec.iid)
    if sec.wave_id:
        members = sorted(r.iid for r in sec.records if r.wave_id == sec.wave_id)
        if members != sorted(configured):
            raise ValueError(f"wave {sec.wave_id} must hold every configured engine")
        stray = sorted(r.iid for r in sec.records if r.wave_id != sec.wave_id)
        if stray:
            raise ValueError(f"lifecycle records outside wave {sec.wave_id}: {', '.join(stray)}")
    else:
        orphans = sorted(r.iid for r in sec.records if r.wave_id)
        if orphans:
            raise ValueError(f"lifecycle records name a wave that is not active: {', '.join(orphans)}")
    return sec
