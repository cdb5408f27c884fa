"""Breaker: leg-failure evidence → eject / probe / hold / readmit decisions (spec §9.1). Pure.

No I/O and no sleeping: the caller passes evidence in, gets a :class:`Decision` back, and
``router/probes.py`` runs whatever probe the decision asks for, feeding the result back here.

Ejection cap (Envoy's ``max_ejection_percent`` idea, narrowed to roles): the breaker never ejects,
holds or quarantines an engine when that would leave a role below its floor
(``controller.min_prefill`` / ``min_decode``, default 1: never the last placement-eligible engine
able to serve a role; ``Scheduler.floor_breach``, the same rule the lifecycle applies to drains).
Such an ejection is reported as ``spared`` instead, so a fleet that is failing everywhere keeps
answering (with errors) rather than going dark.

Failure quarantine (``recovery.failure_quarantine_s`` > 0): every leg failure also holds the engine
out of placement for that long (timed, on the injected monotonic clock; a later failure extends
it). Journal event ``engine_quarantined``; ``/narwhal/state`` shows the hold and its end.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from router.clock import Clock
from router.scheduler import Scheduler

FailureClass = Literal["connection", "timeout", "overload", "inference_status", "kv_handoff", "stream"]
FAILURE_CLASSES: tuple[FailureClass, ...] = (
    "connection",
    "timeout",
    "overload",
    "inference_status",
    "kv_handoff",
    "stream",
)
INFERENCE_CLASSES: frozenset[str] = frozenset({"inference_status", "kv_handoff", "stream"})
Evidence = Literal["prefill", "decode", "transport", "health", "verification", "lifecycle"]
# Which failure streaks a piece of success evidence clears.
_CLEARS: dict[str, frozenset[str]] = {
    "prefill": frozenset(FAILURE_CLASSES),
    "decode": frozenset(FAILURE_CLASSES),
    "transport": frozenset({"connection", "inference_status"}),
    "health": frozenset({"connection", "timeout", "overload"}),
    "verification": frozenset(FAILURE_CLASSES),
    "lifecycle": frozenset(FAILURE_CLASSES),
}
Action = Literal["none", "eject", "probe_health", "probe_inference", "spared"]
EJECTION_CAUSES: tuple[str, ...] = (
    "connection",
    "liveness",
    "health_probe",
    "inference_probe",
    "drift",
    "process_identity",
    "profile_generation",
    "role_switch",
)


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    iid: str = ""
    cause: str = ""


NONE = Decision("none")


class Breaker:
    def __init__(
        self,
        scheduler: Scheduler,
        clock: Clock,
        eject_after: int = 3,
        emit: Callable[[dict[str, Any]], None] | None = None,
        quarantine_s: float = 0.0,
    ) -> None:
        self.scheduler = scheduler
        self.clock = clock
        self.eject_after = eject_after
        self.quarantine_s = quarantine_s
        self.emit = emit or (lambda _row: None)
        self.streaks: dict[str, dict[str, int]] = {iid: defaultdict(int) for iid in scheduler.engines}
        self.probing: set[str] = set()  # engines with a probe in flight
        self.last_probe: dict[str, float] = {}  # iid -> monotonic time of the last readmission probe
        self.ejections: dict[tuple[str, str], int] = defaultdict(int)  # (iid, cause) -> count
        self.readmissions: dict[str, int] = defaultdict(int)
        self.spared: dict[tuple[str, str], int] = defaultdict(int)
        self.probes: dict[tuple[str, str, str], int] = defaultdict(int)  # (iid, kind, outcome)
        self.quarantines: dict[str, int] = defaultdict(int)  # iid -> quarantines started
        scheduler.on_eject.append(self._on_eject)

    # -- evidence ---------------------------------------------------------------------------
    def record_failure(self, iid: str, cls: FailureClass, producer: str = "") -> Decision:
        """One leg failure of class ``cls`` on ``iid``; ``producer`` = prefill engine of a decode leg."""
        if self.quarantine_s > 0:
            self._quarantine(iid, cls)
        streak = self.streaks.setdefault(iid, defaultdict(int))
        streak[cls] += 1
        if cls == "stream" and iid in self.scheduler.inference_suspects:
            self.scheduler.inference_suspects[iid].add(producer if producer != iid else "")
        if streak[cls] < self.eject_after or iid in self.scheduler.ejected:
            return NONE
        streak[cls] = 0
        if cls == "connection":
            return self.eject(iid, "connection")
        if cls in ("timeout", "overload"):
            return NONE if iid in self.probing else Decision("probe_health", iid, cls)
        # inference classes: suspect, hold if others cover its roles, verify by an inference probe
        sources = self.scheduler.inference_suspects.setdefault(iid, set())
        sources.add(producer if cls == "stream" and producer != iid else "")
        if iid not in self.scheduler.held and not self.sole_server(iid):
            self.scheduler.held[iid] = f"inference suspect ({cls})"
            self._event("engine_hold_started", iid, cause=cls)
        return NONE if iid in self.probing else Decision("probe_inference", iid, cls)

    def record_success(self, iid: str, evidence: Evidence) -> None:
        streak = self.streaks.get(iid)
        if streak:
            for cls in _CLEARS[evidence]:
                if streak.get(cls):
                    streak[cls] = 0

    # -- probe results ----------------------------------------------------------------------
    def health_result(self, iid: str, ok: bool | None) -> Decision:
        """Result of a health probe started for a timeout/overload streak (None = inconclusive)."""
        self.probes[(iid, "health", _outcome(ok))] += 1
        if ok is None:
            return NONE
        if ok:
            self.record_success(iid, "health")
            return NONE
        return self.eject(iid, "health_probe")

    def inference_result(self, iid: str, ok: bool | None) -> Decision:
        """Result of an inference probe of a suspect: pass clears it, failure ejects it."""
        self.probes[(iid, "inference", _outcome(ok))] += 1
        if ok is None:
            return NONE
        if ok:
            self.clear_suspect(iid)
            self.record_success(iid, "verification")
            return NONE
        return self.eject(iid, "inference_probe")

    def readmission_probe(self, iid: str, ok: bool | None, evidence: Evidence = "health") -> bool:
        """Result of a recovery probe of an ejected engine; True when it was readmitted."""
        self.last_probe[iid] = self.clock.monotonic()
        self.probes[(iid, "readmission", _outcome(ok))] += 1
        return bool(ok) and self.readmit(iid, evidence)

    # -- state changes ----------------------------------------------------------------------
    def eject(self, iid: str, cause: str) -> Decision:
        """Eject unless ``iid`` is the last engine able to serve one of its roles (then: spared)."""
        if iid in self.scheduler.ejected:
            return NONE
        if self.sole_server(iid):
            self.spared[(iid, cause)] += 1
            self._event("engine_ejection_spared", iid, cause=cause)
            return Decision("spared", iid, cause)
        self.scheduler.held.pop(iid, None)
        self.scheduler.eject(iid, cause)  # -> _on_eject records the event and the metric
        return Decision("eject", iid, cause)

    def readmit(self, iid: str, evidence: str) -> bool:
        if not self.scheduler.uneject(iid):
            return False
        self.clear_suspect(iid)
        self.streaks[iid] = defaultdict(int)
        self.readmissions[iid] += 1
        self._event("engine_readmitted", iid, evidence=evidence)
        return True

    def clear_suspect(self, iid: str) -> None:
        self.scheduler.inference_suspects.pop(iid, None)
        if self.scheduler.held.pop(iid, None) is not None:
            self._event("engine_hold_ended", iid)

    def _quarantine(self, iid: str, cls: str) -> None:
        sched = self.scheduler
        if iid in sched.ejected or iid not in sched.engines or self.sole_server(iid):
            return  # an engine the fleet cannot spare keeps serving (the floor rule)
        fresh = iid not in sched.quarantined
        sched.quarantine(iid, self.quarantine_s, cls)
        if fresh:
            self.quarantines[iid] += 1
            self._event("engine_quarantined", iid, cause=cls, duration_s=self.quarantine_s)

    def sole_server(self, iid: str) -> bool:
        """True if taking ``iid`` out would leave a role it can serve below its floor (spec §9.1)."""
        return self.scheduler.floor_breach([iid]) is not None

    def due_for_readmission(self, interval_s: float) -> list[str]:
        """Ejected engines whose last recovery probe is at least ``interval_s`` old."""
        now = self.clock.monotonic()
        return [
            iid
            for iid in sorted(self.scheduler.ejected)
            if iid not in self.probing and now - self.last_probe.get(iid, float("-inf")) >= interval_s
        ]

    def _on_eject(self, iid: str, cause: str) -> None:
        self.ejections[(iid, cause)] += 1
        self.last_probe[iid] = self.clock.monotonic()
        self._event("engine_ejected", iid, cause=cause)

    def _event(self, event: str, iid: str, **fields: Any) -> None:
        self.emit(
            {"event": event, "at": self.clock.wall(), "iid": iid, **fields}
        )  # wall time, like every event


def _outcome(ok: bool | None) -> str:
    return "inconclusive" if ok is None else ("pass" if ok else "fail")
