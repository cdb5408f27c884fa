"""Placement state: which engines exist, which may take new work, and how much each holds.

Pure data + decisions, no I/O. The breaker writes ``ejected``; the lifecycle writes ``draining``
and ``fleet_hold``; serving reads ``pick`` and updates resident counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

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


@dataclass
class Scheduler:
    engines: dict[str, EngineRuntime]
    ejected: dict[str, str] = field(default_factory=dict)  # iid -> ejection cause
    draining: set[str] = field(default_factory=set)  # lifecycle holds
    held: dict[str, str] = field(default_factory=dict)  # breaker holds: iid -> reason (inference suspect)
    inference_suspects: dict[str, set[str]] = field(default_factory=dict)  # iid -> producer ids ("" = none)
    fleet_hold: str = ""  # router-wide lifecycle hold reason ("" = none)
    on_eject: list[Callable[[str, str], None]] = field(default_factory=list)
    _turn: int = 0

    @classmethod
    def from_specs(cls, specs: Iterable[EngineSpec]) -> Scheduler:
        engines = {
            s.iid: EngineRuntime(s.iid, s.url, s.role, s.pin, s.attestation_url)
            for s in sorted(specs, key=lambda s: s.iid)
        }
        return cls(engines=engines)

    def accepts_new(self, iid: str) -> bool:
        return (
            not self.fleet_hold
            and iid not in self.ejected
            and iid not in self.draining
            and iid not in self.held
        )

    def eligible(self) -> list[EngineRuntime]:
        if self.fleet_hold:
            return []
        return [
            e
            for e in self.engines.values()
            if e.iid not in self.ejected and e.iid not in self.draining and e.iid not in self.held
        ]

    def pick(self, phase: Role, exclude: Iterable[str] = ()) -> EngineRuntime | None:
        """Least resident work among eligible engines labelled for ``phase``; else any unpinned one.

        Ties rotate: among equally loaded candidates the one picked least recently wins, so equally
        loaded engines of a role share light traffic in turn (whatever the other role's picks did).
        One pass over the engines, no intermediate list.
        """
        if self.fleet_hold:
            return None
        ejected, draining, held = self.ejected, self.draining, self.held
        best: EngineRuntime | None = None
        fallback: EngineRuntime | None = None
        best_key = fallback_key = (1 << 62, 0)
        for e in self.engines.values():
            iid = e.iid
            if iid in ejected or iid in draining or iid in held or (exclude and iid in exclude):
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
