"""Build a handoff from a live router, and apply one to it (spec §2.4–2.5) — all or nothing.

``apply`` validates everything first (engine set, restart policy, contracted identities, lifecycle
coherence, and a trial restore when the lifecycle object offers one) and only then mutates, the
lifecycle restore first: it is strict and raises before changing anything, and every later step
cannot fail. Rejection reasons are the peer's, verbatim.

``Handover`` is the typed seam: the core plus the two collaborators a handoff reads and writes,
given by ``router/assemble.py`` (or a test):

- ``lifecycle``: a ``LifecycleView`` (``LifecycleService``, or a bare ``LifecycleMachine`` in unit
  tests) with ``snapshot() -> LifecycleSection`` and a strict ``restore``; ``None`` keeps at least
  the holds (non-active engines stay out of placement). ``router.lifecycle.restore.checked_section``
  is the trial.
- ``breaker``: a restored ejection drops its ``last_probe`` entry so the readmission probe is due at
  once. Inference suspects live on ``scheduler.inference_suspects``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from router.config import FleetConfig, Role
from router.core import RouterCore
from router.ha.handoff import Handoff, validate
from router.lifecycle.models import LifecycleSection
from router.lifecycle.restore import checked_section

log = logging.getLogger("narwhal.ha")
RESTORED_EJECTION = "handoff"


class LifecycleView(Protocol):
    """What HA needs of the lifecycle: its persisted section, a strict restore, the wave hold."""

    def snapshot(self) -> LifecycleSection: ...

    def restore(self, section: LifecycleSection | Mapping[str, Any]) -> None: ...

    def require_restart_wave(self, reason: str, reset: bool = False) -> bool: ...


class ProbeSchedule(Protocol):
    """The breaker's probe bookkeeping (``router.breaker.Breaker``)."""

    last_probe: dict[str, float]


# -- build ----------------------------------------------------------------------------------------


def lifecycle_section(core: RouterCore, lifecycle: LifecycleView | None) -> LifecycleSection:
    if lifecycle is not None:
        return lifecycle.snapshot()
    return LifecycleSection(engine_restart_policy=core.config.recovery.engine_restart_policy)


def inference_sources(core: RouterCore) -> dict[str, list[str]]:
    """Current inference suspects → sorted producer IDs (``[""]``: probe the suspect locally)."""
    suspects = core.scheduler.inference_suspects
    return {iid: sorted(set(p)) or [""] for iid, p in sorted(suspects.items())}


def build(core: RouterCore, lifecycle: LifecycleView | None) -> Handoff:
    """The live document (validated: a router never publishes what it would refuse to read)."""
    scheduler = core.scheduler
    doc = Handoff(
        at=core.clock.wall(),
        run=core.journal.run_id,
        model=core.config.model,
        epoch=core.control.epoch,
        holder=core.control.holder,
        engines=core.config.engine_ids,
        roles=dict(sorted(scheduler.roles().items())),
        ejected=sorted(scheduler.ejected),
        inference_sources=inference_sources(core),
        counters=core.counters.snapshot(),
        outcome_reasons=core.counters.outcome_reasons(),
        lifecycle=lifecycle_section(core, lifecycle),
        demand_risk=core.demand_risk.snapshot(),
    )
    return validate(doc)


# -- pure checks ---------------------------------------------------------------------------------


def held_engines(section: LifecycleSection) -> set[str]:
    return {r.iid for r in section.records if r.state != "active"}


def check_lifecycle(section: LifecycleSection, config: FleetConfig) -> str:
    """The lifecycle's own strict restore check, run as a trial (pure); "" when restorable."""
    try:
        checked_section(section, config.engine_ids, config.recovery.engine_restart_policy)
    except ValueError as exc:
        return f"handoff lifecycle rejected: {exc}"
    return ""


def rejection(doc: Handoff | None, core: RouterCore) -> str:
    """The §2.4 reason this document must not be applied here, or ""."""
    if doc is None:
        return "no handoff file"
    config = core.config
    names = sorted(doc.engines)
    if names != config.engine_ids:
        return f"handoff names {names}, this fleet is {config.engine_ids}"
    if doc.lifecycle.engine_restart_policy != config.recovery.engine_restart_policy:
        return "handoff engine restart policy mismatch"
    if config.engine_contract is not None:
        excused = set(doc.ejected) | held_engines(doc.lifecycle)
        if any(i not in excused and i not in doc.lifecycle.process_starts for i in names):
            return "handoff lacks an available engine's process identity"
    if doc.model != config.model:
        return f"handoff model {doc.model!r} is not the configured model {config.model!r}"
    return check_lifecycle(doc.lifecycle, config)


# -- apply ----------------------------------------------------------------------------------------


def _restore_lifecycle_fallback(core: RouterCore, section: LifecycleSection) -> None:
    """Without a lifecycle object, keep at least the holds: non-active engines stay out of placement."""
    core.scheduler.draining |= held_engines(section)
    if section.wave_id:
        core.scheduler.fleet_hold = f"whole-wave drain {section.wave_id}"


def apply(
    core: RouterCore,
    doc: Handoff | None,
    lifecycle: LifecycleView | None,
    breaker: ProbeSchedule | None = None,
) -> tuple[bool, str]:
    """Apply a validated handoff; ``(False, reason)`` leaves the router exactly as it was."""
    if doc is not None:
        try:
            doc = validate(doc)
        except ValueError as exc:
            return False, str(exc)
    why = rejection(doc, core)
    if why:
        return False, why
    assert doc is not None
    if lifecycle is not None:
        try:
            lifecycle.restore(doc.lifecycle)  # strict: raises before mutating anything
        except Exception as exc:  # any refusal of the lifecycle leaves the router untouched
            return False, f"handoff lifecycle rejected: {type(exc).__name__}: {exc}"
    else:
        _restore_lifecycle_fallback(core, doc.lifecycle)
    # -- from here on nothing can fail --
    scheduler = core.scheduler
    for iid, role in doc.roles.items():
        engine = scheduler.engines.get(iid)
        if engine is not None and not engine.pin:
            engine.role = role
    for iid in doc.ejected:
        scheduler.eject(iid, RESTORED_EJECTION)
        _due_now(breaker, iid)
    _restore_suspects(core, doc.inference_sources, breaker)
    core.counters.restore(doc.counters, doc.outcome_reasons)
    core.demand_risk.rearm(doc.demand_risk)
    gap = max(0.0, core.clock.wall() - doc.at)
    summary = (
        f"handoff applied: gap {gap:.2f}s from run {doc.run}; {len(doc.roles)} roles, "
        f"{len(doc.ejected)} ejected; counters served={doc.counter('served')} "
        f"failed={doc.counter('failed')} unserved={doc.counter('unserved')}"
    )
    return True, summary


def _due_now(breaker: ProbeSchedule | None, iid: str) -> None:
    """A restored ejection gets a far-past probe time so the readmission probe is due at once."""
    if breaker is not None:
        breaker.last_probe.pop(iid, None)


def _restore_suspects(core: RouterCore, sources: dict[str, list[str]], breaker: ProbeSchedule | None) -> None:
    """§2.4 step 3: suspects with their producers; a covered, non-ejected suspect is ejected too."""
    scheduler = core.scheduler
    for iid in sorted(sources):
        scheduler.inference_suspects[iid] = set(sources[iid])
        if iid in scheduler.ejected:
            continue
        engine = scheduler.engines[iid]
        roles: tuple[Role, ...] = ("prefill", "decode") if not engine.pin else (engine.role,)
        if all(scheduler.serving_engines_for(r, without=iid) > 0 for r in roles):
            scheduler.eject(iid, "inference_probe")
            _due_now(breaker, iid)


@dataclass(frozen=True)
class Handover:
    """A router's side of the handoff: build its live document, apply one to it (all or nothing)."""

    core: RouterCore
    lifecycle: LifecycleView | None = None
    breaker: ProbeSchedule | None = None

    def build(self) -> Handoff:
        return build(self.core, self.lifecycle)

    def apply(self, doc: Handoff | None) -> tuple[bool, str]:
        return apply(self.core, doc, self.lifecycle, self.breaker)
