"""The engine lifecycle state machine (spec §4.2, §5.3, §5.6, §6.1): pure, with an injected clock.

No sockets and no sleeps. The machine owns the lifecycle records, the wave, the event list and the
accepted process starts, and writes the scheduler's ``draining`` set and ``fleet_hold`` so placement
follows every transition at once. Adapters (``service``, ``monitor``, ``readmission``) do the I/O and
feed the results back through ``record_old_identity`` / ``record_capture_failure`` /
``complete_validation``. State refresh (drained, deadline_exceeded) is lazy: ``refresh`` runs on
every view, snapshot and mutation.
"""

from __future__ import annotations

import math
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from router.clock import Clock
from router.config import FleetConfig
from router.lifecycle.models import MAX_EVENTS, DrainRecord, LifecycleSection
from router.lifecycle.restore import checked_section
from router.scheduler import FloorBreach, Scheduler

HOLD_STATES = frozenset({"draining", "drained", "deadline_exceeded", "validating", "blocked"})
INTERRUPTED = "readmission validation was interrupted by router replacement"
WAVE_PEER_FAILED = "another engine in the wave failed validation"

Event = dict[str, Any]


class LifecycleError(ValueError):
    """A lifecycle request the current state does not allow (HTTP 409), or a malformed restore."""


def floor_message(targets: list[str], breach: FloorBreach) -> str:
    """409 text for a drain that would take a role below ``controller.min_<role>``."""
    return (
        f"draining {', '.join(targets)} would leave {breach.remaining} engine(s) able to serve the "
        f"{breach.role} role, below controller.min_{breach.role} = {breach.floor}"
    )


def new_wave_id() -> str:
    return f"wave-{uuid.uuid4().hex[:12]}"


@dataclass
class Verdict:
    """One engine's readmission result: passed check labels, failures, and the accepted start."""

    checks: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    process_start: float | None = None

    @property
    def ok(self) -> bool:
        return not self.errors


class Residency(Protocol):
    """Resident work on an engine and whether it may stop (active-active: ``replicas.picture``)."""

    def resident_total(self, iid: str) -> int: ...

    def stop_gate(self, iid: str) -> bool:
        """The condition ``ready_to_stop`` needs beyond this router's own lifecycle."""
        ...


class LocalResidency:
    """One router: the scheduler's own resident work; nothing else gates a stop."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def resident_total(self, iid: str) -> int:
        return self.scheduler.engines[iid].resident

    def stop_gate(self, iid: str) -> bool:
        return True


class LifecycleMachine:
    def __init__(
        self,
        config: FleetConfig,
        scheduler: Scheduler,
        clock: Clock,
        on_event: Callable[[Event], None] | None = None,
        wave_ids: Callable[[], str] = new_wave_id,
        residency: Residency | None = None,
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.clock = clock
        self.policy = config.recovery.engine_restart_policy
        self.records: dict[str, DrainRecord] = {}
        self.wave_id = ""
        self.events: deque[Event] = deque(maxlen=MAX_EVENTS)
        self.process_starts: dict[str, float] = {}
        self.on_event = on_event
        self.on_readmitted: list[Callable[[str], None]] = []
        # un-ejects a readmitted engine; wiring routes it through the breaker (streaks, counters)
        self.readmit_hook: Callable[[str], object] = scheduler.uneject
        # resident work on an engine and the extra condition ``ready_to_stop`` needs: this router's
        # own (active-active: the replica set's, summed over / applied by every live replica)
        self.residency: Residency = residency if residency is not None else LocalResidency(scheduler)
        self._wave_ids = wave_ids
        self._deadline_mono: dict[str, float] = {}
        self._wave_announced = ""

    # -- views -------------------------------------------------------------------------------
    @property
    def engine_ids(self) -> list[str]:
        return self.config.engine_ids

    def state(self, iid: str) -> str:
        rec = self.records.get(iid)
        return rec.state if rec is not None else "active"

    def held(self) -> list[str]:
        return sorted(iid for iid, r in self.records.items() if r.state in HOLD_STATES)

    def wave_members(self) -> list[str]:
        return sorted(iid for iid, r in self.records.items() if r.wave_id == self.wave_id)

    def wave_ready_to_stop(self) -> bool:
        """Peer quirk kept: without a wave, the members are the individually held records."""
        members = [self.records[i] for i in self.wave_members()]
        return bool(members) and all(r.state == "drained" for r in members)

    def ready_to_stop(self, iid: str) -> bool:
        rec = self.records.get(iid)
        if rec is None or rec.old_process_start is None or rec.state != "drained":
            return False
        if self.residency.resident_total(iid) or not self.residency.stop_gate(iid):
            return False  # never while work is resident, whatever the record says
        return not rec.wave_id or self.wave_ready_to_stop()

    # -- events ------------------------------------------------------------------------------
    def emit(self, action: str, **fields: Any) -> Event:
        event: Event = {"event": "engine_lifecycle", "action": action, "at": self.clock.wall(), **fields}
        self.events.append(event)
        if self.on_event is not None:
            self.on_event(event)
        return event

    def note_process_excluded(self, iid: str, previous: float | None, observed: float | None) -> None:
        self.emit(
            "process_excluded",
            iid=iid,
            reason="engine process changed",
            previous_process_start=previous,
            observed_process_start=observed,
        )

    # -- drain (spec §5.3) -------------------------------------------------------------------
    def _targets(self, engines: Iterable[str], wave: bool) -> list[str]:
        targets = sorted(set(engines))
        return self.engine_ids if wave and not targets else targets

    def _check_known(self, targets: list[str]) -> None:
        unknown = [i for i in targets if i not in self.scheduler.engines]
        if unknown:
            raise LifecycleError(f"unknown engine(s): {', '.join(unknown)}")

    def begin(self, engines: Iterable[str], wave: bool, deadline_s: float) -> bool:
        """Start (or retry the identity capture of) a drain. True when new records were made."""
        if self.policy == "whole_wave" and not wave:
            raise LifecycleError("engine_restart_policy requires a whole-wave drain")
        targets = self._targets(engines, wave)
        self._check_known(targets)
        if isinstance(deadline_s, bool) or not math.isfinite(deadline_s) or deadline_s <= 0:
            raise LifecycleError("deadline_s must be positive")
        if wave and targets != self.engine_ids:
            raise LifecycleError("a whole-wave drain must name every configured engine")
        if not wave and len(targets) != 1:
            raise LifecycleError("a non-wave drain must name exactly one engine")
        held = self.held()
        keep_identity: dict[str, float] = {}
        if held:
            recs = [self.records[i] for i in held]
            same_shape = bool(self.wave_id) == wave
            if held == targets and same_shape and all(r.state != "validating" for r in recs):
                if all(r.restart_required for r in recs) and any(r.old_process_start is None for r in recs):
                    return False  # identity retry: re-capture only, no new records
                if not wave and all(r.state == "blocked" and not r.restart_required for r in recs):
                    held = []  # an operator drain replaces this engine's own failed recovery
            if held and wave and not self.wave_id and not self.scheduler.eligible():
                keep_identity = {  # promotion of an individual hold to a whole wave
                    r.iid: r.old_process_start
                    for r in recs
                    if r.restart_required and r.old_process_start is not None
                }
                held = []
            if held:
                raise LifecycleError(f"lifecycle action already active for {', '.join(held)}")
        if not wave:
            others = [e for e in self.scheduler.eligible() if e.iid not in targets]
            if not others:
                raise LifecycleError("the last schedulable engine requires a whole-wave drain")
            breach = self.scheduler.floor_breach(targets)
            if breach is not None:
                raise LifecycleError(floor_message(targets, breach))
        wave_id = self._wave_ids() if wave else ""
        now, mono = self.clock.wall(), self.clock.monotonic()
        for iid in targets:
            self.records[iid] = DrainRecord(
                iid=iid,
                state="draining",
                requested_at=now,
                deadline_at=now + deadline_s,
                restart_required=True,
                wave_id=wave_id,
                old_process_start=keep_identity.get(iid),
            )
            self._deadline_mono[iid] = mono + deadline_s
            self.scheduler.draining.add(iid)
            self.scheduler.quarantined.pop(iid, None)  # the drain replaces a timed failure hold
            self.emit("drain_started", iid=iid, wave_id=wave_id)
        if wave:
            self._set_wave(wave_id, f"whole-wave drain {wave_id}")
            self.emit("wave_started", engines=targets, wave_id=wave_id)
        self.refresh()
        return True

    def _set_wave(self, wave_id: str, hold: str) -> None:
        self.wave_id = wave_id
        self._wave_announced = ""
        self.scheduler.fleet_hold = hold

    def pending_identity(self, engines: Iterable[str], wave: bool) -> list[str]:
        """Targets of this drain request whose pre-restart identity is not recorded yet."""
        targets = self._targets(engines, wave)
        return [i for i in targets if (r := self.records.get(i)) is not None and r.old_process_start is None]

    def record_old_identity(self, iid: str, process_start: float) -> None:
        rec = self.records[iid]
        rec.old_process_start = process_start
        rec.error = ""
        if rec.state == "blocked":
            rec.state = "draining"
        self.emit("process_recorded", iid=iid, process_start=process_start, wave_id=rec.wave_id)
        self.refresh()

    def record_capture_failure(self, iid: str, error: str) -> None:
        rec = self.records[iid]
        rec.state = "blocked"
        rec.error = error
        self.emit("drain_blocked", iid=iid, error=error, wave_id=rec.wave_id)

    def bind_capture(self, iid: str, result: float | str) -> str:
        """Apply one capture result (a start, or an error text); returns the error that remains."""
        if not isinstance(result, str):
            self.record_old_identity(iid, result)
            return ""
        if iid in self.scheduler.ejected and iid in self.process_starts:
            self.record_old_identity(iid, self.process_starts[iid])  # last verified identity
            return ""
        self.record_capture_failure(iid, result)
        return result

    # -- lazy refresh (spec §4.2, §5.4) ------------------------------------------------------
    def refresh(self, resident_by_engine: Mapping[str, int] | None = None) -> None:
        resident = resident_by_engine
        if resident is None:
            resident = {iid: self.residency.resident_total(iid) for iid in self.records}
        mono, wall = self.clock.monotonic(), self.clock.wall()
        for iid in sorted(self.records):
            rec = self.records[iid]
            if rec.state not in ("draining", "deadline_exceeded"):
                continue
            n = resident.get(iid, 0)
            if n == 0 and rec.old_process_start is not None:
                rec.state = "drained"
                self.emit("drain_complete", iid=iid, wave_id=rec.wave_id)
            elif rec.state == "draining" and n > 0 and self._past_deadline(rec, mono, wall):
                rec.state = "deadline_exceeded"
                rec.error = f"{n} resident request(s) remain after the drain deadline"
                self.emit("drain_deadline_exceeded", iid=iid, resident=n, wave_id=rec.wave_id)
        if self.wave_id and self._wave_announced != self.wave_id and self.wave_ready_to_stop():
            self._wave_announced = self.wave_id
            self.emit("wave_ready_to_stop", engines=self.wave_members(), wave_id=self.wave_id)

    def _past_deadline(self, rec: DrainRecord, mono: float, wall: float) -> bool:
        deadline = self._deadline_mono.get(rec.iid)
        return mono > deadline if deadline is not None else wall > rec.deadline_at

    # -- readmission (spec §6.1) -------------------------------------------------------------
    def mark_validating(self, engines: Iterable[str], wave: bool) -> list[str]:
        targets = self._targets(engines, wave)
        self._check_known(targets)
        if wave and (not self.wave_id or targets != self.wave_members()):
            raise LifecycleError("whole-wave readmission must name the active wave's complete engine set")
        if not wave and self.wave_id:
            raise LifecycleError("an active whole wave must be validated and readmitted as one engine set")
        if not wave and len(targets) != 1:
            raise LifecycleError("readmission must name exactly one engine")
        self.refresh()
        for iid in targets:
            state = self.state(iid)
            if state not in ("drained", "blocked"):
                raise LifecycleError(f"{iid} is {state}, expected drained")
        for iid in targets:
            rec = self.records[iid]
            if rec.restart_required and rec.old_process_start is None:
                if self.policy == "whole_wave":
                    raise LifecycleError("whole-wave recovery requires recorded pre-restart identities")
                raise LifecycleError(f"{iid} has no recorded pre-restart process identity")
        for iid in targets:
            self._to_validating(iid)
            self.emit("validation_started", iid=iid, wave_id=self.records[iid].wave_id)
        return targets

    def _to_validating(self, iid: str) -> None:
        rec = self.records[iid]
        rec.state = "validating"
        rec.error = ""
        rec.checks = []
        rec.new_process_start = None
        self.scheduler.draining.add(iid)

    def start_recovery(self, engines: Iterable[str], wave: bool) -> list[str]:
        """Automatic recovery of ejected engines on their running processes (spec §6.7, §7.3)."""
        targets = self._targets(engines, wave)
        self._check_known(targets)
        if self.policy == "whole_wave":
            raise LifecycleError("engine_restart_policy requires a managed whole-wave restart")
        if wave and targets != self.engine_ids:
            raise LifecycleError("a recovery wave must name every configured engine")
        if not wave and len(targets) != 1:
            raise LifecycleError("recovery validation must name exactly one engine")
        not_ejected = [i for i in targets if i not in self.scheduler.ejected]
        if not_ejected:
            raise LifecycleError(f"recovery requires an ejected engine: {', '.join(not_ejected)}")
        conflicting = [
            i
            for i in self.held()
            if i in targets
            or not (self.records[i].state == "blocked" and not self.records[i].restart_required)
        ]
        if self.wave_id or conflicting:
            raise LifecycleError(
                f"lifecycle action already active for {', '.join(conflicting or self.held())}"
            )
        wave_id = self._wave_ids() if wave else ""
        now = self.clock.wall()
        for iid in targets:
            self.records[iid] = DrainRecord(
                iid=iid,
                state="validating",
                requested_at=now,
                deadline_at=now,
                restart_required=False,
                wave_id=wave_id,
            )
            self._deadline_mono.pop(iid, None)
            self.scheduler.draining.add(iid)
            self.emit("recovery_validation_started", iid=iid, wave_id=wave_id)
        if wave:
            self._set_wave(wave_id, f"whole-wave drain {wave_id}")
        return targets

    def complete_validation(self, verdicts: Mapping[str, Verdict]) -> bool:
        """All-or-nothing over the validating set: every member readmitted, or every member blocked."""
        targets = sorted(verdicts)
        recs = [self.records.get(i) for i in targets]
        if not targets or any(r is None or r.state != "validating" for r in recs):
            return False  # the set changed underneath (e.g. a restart-wave reset): nothing to apply
        ok = all(v.ok and v.process_start is not None for v in verdicts.values())
        wave_id = self.wave_id
        wave_complete = bool(wave_id) and targets == self.wave_members()
        for iid in targets:
            rec, v = self.records[iid], verdicts[iid]
            rec.checks = list(v.checks)
            if ok:
                assert v.process_start is not None
                rec.state = "active"
                rec.new_process_start = v.process_start
                rec.wave_id = ""
                self.process_starts[iid] = v.process_start
                self.scheduler.draining.discard(iid)
                if iid in self.scheduler.ejected:
                    self.readmit_hook(iid)
                self.emit("readmitted", iid=iid, process_start=v.process_start, wave_id=wave_id)
                for callback in list(self.on_readmitted):
                    callback(iid)
            else:
                rec.state = "blocked"
                rec.error = (
                    "; ".join(v.errors)
                    if v.errors
                    else (WAVE_PEER_FAILED if len(targets) > 1 else "no accepted process start")
                )
                self.emit("validation_failed", iid=iid, error=rec.error, wave_id=rec.wave_id)
        if ok and wave_complete:
            self.emit("wave_readmitted", engines=targets, wave_id=wave_id)
            self._set_wave("", "")
        return ok

    # -- whole-wave restart hold (spec §5.6) -------------------------------------------------
    def require_restart_wave(self, reason: str, reset: bool = False) -> bool:
        if self.wave_id and not reset:
            return False
        wave_id = self._wave_ids()
        now = self.clock.wall()
        for iid in self.engine_ids:
            self.records[iid] = DrainRecord(
                iid=iid,
                state="blocked",
                requested_at=now,
                deadline_at=now,
                restart_required=True,
                wave_id=wave_id,
                error=reason,
            )
            self._deadline_mono.pop(iid, None)
            self.scheduler.draining.add(iid)
        self._set_wave(wave_id, f"whole-wave restart required: {reason}")
        self.emit("restart_required", wave_id=wave_id, reason=reason)
        return True

    # -- persistence (spec §2.4 step 6) ------------------------------------------------------
    def snapshot(self) -> LifecycleSection:
        self.refresh()
        return LifecycleSection(
            wave_id=self.wave_id,
            records=[self.records[i].model_copy(deep=True) for i in sorted(self.records)],
            events=[dict(e) for e in self.events],
            engine_restart_policy=self.policy,
            process_starts=dict(sorted(self.process_starts.items())),
        )

    def restore(self, section: LifecycleSection | Mapping[str, Any], follower: bool = False) -> None:
        """Strict: any malformed part raises LifecycleError and leaves every hold untouched.

        ``follower``: an active-active replica mirroring the holder's live state, not a replacement
        router — a ``validating`` record stays ``validating`` (the holder is still validating it).
        """
        try:
            sec = checked_section(section, self.engine_ids, self.policy)
        except ValueError as exc:
            raise LifecycleError(str(exc)) from None
        records: dict[str, DrainRecord] = {}
        for rec in sec.records:
            rec = rec.model_copy(deep=True)
            if rec.state == "validating" and not follower:
                rec.state = "blocked"
                rec.error = INTERRUPTED
            records[rec.iid] = rec
        self.records = records
        self.process_starts = dict(sec.process_starts)
        self.events = deque((dict(e) for e in sec.events[-MAX_EVENTS:]), maxlen=MAX_EVENTS)
        mono, wall = self.clock.monotonic(), self.clock.wall()
        self._deadline_mono = {i: mono + (r.deadline_at - wall) for i, r in records.items()}
        self.scheduler.draining = {i for i, r in records.items() if r.state in HOLD_STATES}
        self._set_wave(sec.wave_id, f"whole-wave drain {sec.wave_id}" if sec.wave_id else "")
        if sec.wave_id and self.wave_ready_to_stop():
            self._wave_announced = sec.wave_id
