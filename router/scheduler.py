"""Placement state: which engines exist, which may take new work, and how much each holds.

Pure data + decisions, no I/O. The breaker writes ``ejected``, ``held`` and ``quarantined``; the
lifecycle writes ``draining`` and ``fleet_hold``; the monitor writes ``excluded`` (engines that do
not serve the configured model); serving reads ``pick`` and updates resident counts.

Role floors (``controller.min_prefill`` / ``min_decode``): ``floor_breach`` says whether taking
engines out of placement would leave a role with fewer placement-eligible engines able to serve it
than its floor. The lifecycle refuses such a drain (409) and the breaker spares such an ejection,
hold or quarantine: one rule, one place.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from router.config import EngineSpec, Role


@dataclass(slots=True)
class EngineRuntime:
    iid: str
    url: str
    role: Role
    pin: bool
    attestation_url: str
    resident_prefill: int = 0
    resident_decode: int = 0
    opening_decode: int = 0  # decode legs placed whose engine has not answered yet
    last_pick: int = 0  # placement sequence number of this engine's last pick (0 = never)

    @property
    def resident(self) -> int:
        return self.resident_prefill + self.resident_decode

    def can_serve(self, phase: Role) -> bool:
        """vLLM roles are router-side labels: any unpinned engine may serve either leg."""
        return self.role == phase or not self.pin


class Quarantine(NamedTuple):
    until: float  # monotonic time the timed hold ends
    cause: str  # failure class that started it


class FloorBreach(NamedTuple):
    role: Role
    remaining: int  # placement-eligible engines left able to serve the role
    floor: int


ROLES: tuple[Role, ...] = ("prefill", "decode")


@dataclass
class Scheduler:
    engines: dict[str, EngineRuntime]
    ejected: dict[str, str] = field(default_factory=dict)  # iid -> ejection cause
    draining: set[str] = field(default_factory=set)  # lifecycle holds
    held: dict[str, str] = field(default_factory=dict)  # breaker holds: iid -> reason (inference suspect)
    inference_suspects: dict[str, set[str]] = field(default_factory=dict)  # iid -> producer ids ("" = none)
    fleet_hold: str = ""  # router-wide lifecycle hold reason ("" = none)
    on_eject: list[Callable[[str, str], None]] = field(default_factory=list)
    # timed holds after a leg failure (recovery.failure_quarantine_s): iid -> Quarantine
    quarantined: dict[str, Quarantine] = field(default_factory=dict)
    # engines that cannot serve at all (e.g. /v1/models does not list the model): iid -> reason
    excluded: dict[str, str] = field(default_factory=dict)
    floors: dict[Role, int] = field(default_factory=lambda: {"prefill": 1, "decode": 1})
    now: Callable[[], float] = time.monotonic  # the injected monotonic clock (quarantine expiry)
    _turn: int = 0

    @classmethod
    def from_specs(
        cls,
        specs: Iterable[EngineSpec],
        floors: dict[Role, int] | None = None,
        now: Callable[[], float] | None = None,
    ) -> Scheduler:
        engines = {
            s.iid: EngineRuntime(s.iid, s.url, s.role, s.pin, s.attestation_url)
            for s in sorted(specs, key=lambda s: s.iid)
        }
        sched = cls(engines=engines)
        if floors is not None:
            sched.floors = dict(floors)
        if now is not None:
            sched.now = now
        return sched

    def _expire_quarantines(self) -> None:
        now = self.now()
        for iid in [i for i, q in self.quarantined.items() if q.until <= now]:
            del self.quarantined[iid]

    def quarantine(self, iid: str, duration_s: float, cause: str) -> float:
        """Hold ``iid`` out of placement for ``duration_s`` (extends a running one); returns the end."""
        until = self.now() + duration_s
        current = self.quarantined.get(iid)
        if current is not None and current.until >= until:
            return current.until
        self.quarantined[iid] = Quarantine(until, cause)
        return until

    def quarantine_left(self, iid: str) -> float:
        """Seconds of quarantine left for ``iid`` (0.0 when none)."""
        q = self.quarantined.get(iid)
        return 0.0 if q is None else max(0.0, q.until - self.now())

    def accepts_new(self, iid: str) -> bool:
        if self.quarantined:
            self._expire_quarantines()
        return (
            not self.fleet_hold
            and iid not in self.ejected
            and iid not in self.draining
            and iid not in self.held
            and iid not in self.quarantined
            and iid not in self.excluded
        )

    def eligible(self) -> list[EngineRuntime]:
        if self.fleet_hold:
            return []
        if self.quarantined:
            self._expire_quarantines()
        ejected, draining, held = self.ejected, self.draining, self.held
        quarantined, excluded = self.quarantined, self.excluded
        return [
            e
            for e in self.engines.values()
            if e.iid not in ejected
            and e.iid not in draining
            and e.iid not in held
            and e.iid not in quarantined
            and e.iid not in excluded
        ]

    def floor_breach(self, without: Iterable[str]) -> FloorBreach | None:
        """The role that taking ``without`` out of placement would leave below its floor, if any.

        Counts placement-eligible engines able to serve the role (labelled for it, or unpinned:
        vLLM roles are router-side labels); only roles one of ``without`` can serve are checked.
        """
        gone = set(without)
        leaving = [self.engines[i] for i in sorted(gone) if i in self.engines]
        if not leaving:
            return None
        rest = [e for e in self.eligible() if e.iid not in gone]
        for role in ROLES:
            floor = self.floors.get(role, 0)
            if floor <= 0 or not any(e.can_serve(role) for e in leaving):
                continue
            remaining = sum(1 for e in rest if e.can_serve(role))
            if remaining < floor:
                return FloorBreach(role, remaining, floor)
        return None

    def pick(self, phase: Role, exclude: Iterable[str] = ()) -> EngineRuntime | None:
        """Least resident work among eligible engines labelled for ``phase``; else any unpinned one.

        Ties rotate: among equally loaded candidates the one picked least recently wins, so equally
        loaded engines of a role share light traffic in turn (whatever the other role's picks did).
        One pass over the engines, no intermediate list.
        """
        if self.fleet_hold:
            return None
        if self.quarantined:
            self._expire_quarantines()
        ejected, draining, held = self.ejected, self.draining, self.held
        out = self.quarantined or self.excluded  # rare: only then the two extra lookups
        best: EngineRuntime | None = None
        fallback: EngineRuntime | None = None
        best_key = fallback_key = (1 << 62, 0)
        for e in self.engines.values():
            iid = e.iid
            if iid in ejected or iid in draining or iid in held or (exclude and iid in exclude):
                continue
            if out and (iid in self.quarantined or iid in self.excluded):
                continue
            key = (e.resident_prefill + e.resident_decode, e.last_pick)
            if e.role == phase:
                if key < best_key:
                    best, best_key = e, key
            elif not e.pin and key < fallback_key:  # can_serve(phase): unpinned
                fallback, fallback_key = e, key
        chosen = best if best is not None else fallback
        if chosen is not None:
            self._turn += 1
            chosen.last_pick = self._turn
        return chosen

    def serving_engines_for(self, phase: Role, without: str | None = None) -> int:
        """How many placement-eligible engines could serve ``phase`` (optionally ignoring one)."""
        return sum(1 for e in self.eligible() if e.iid != without and e.can_serve(phase))

    def roles(self) -> dict[str, Role]:
        return {iid: e.role for iid, e in self.engines.items()}

    def eject(self, iid: str, cause: str) -> bool:
        if iid in self.ejected:
            return False
        self.ejected[iid] = cause
        for callback in list(self.on_eject):
            callback(iid, cause)
        return True

    def uneject(self, iid: str) -> bool:
        return self.ejected.pop(iid, None) is not None
