"""How an active-active replica follows the holder's lifecycle state (pure; no I/O).

The holder commits its handoff document (``narwhal.handoff`` v1, the same document a standby takes
over with) to the store; every commit has a version (the store's revision of that write). A
follower applies each newer version to its placement with the lifecycle's own strict restore
(``LifecycleMachine.restore(..., follower=True)``) after the same checks ``ha/transfer.apply`` runs
(``transfer.rejection``): held, draining, drained, blocked, validating, wave holds and readmissions
take effect on its scheduler at once. Only the lifecycle follows: breaker ejections, counters,
suspects and demand risk stay the replica's own.

A follower that cannot apply the holder's state (foreign fleet, torn or refused document) keeps
its last good state and stops placing (``blocked``), failing closed: it cannot know which engines
the holder is draining.

``HoldVersions`` remembers, per engine, the first version whose state holds it out of placement;
``ready_to_stop`` needs every live replica to have applied at least that version.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from router.core import RouterCore
from router.ha import transfer
from router.ha.handoff import Handoff
from router.lifecycle.machine import HOLD_STATES, LifecycleError, LifecycleMachine
from router.lifecycle.models import LifecycleSection


def held_out(section: LifecycleSection) -> set[str]:
    """Engines this lifecycle state keeps out of new placement."""
    return {r.iid for r in section.records if r.state in HOLD_STATES}


def readmitted_between(before: LifecycleSection | None, after: LifecycleSection) -> list[str]:
    """Engines ``after`` shows readmitted (active with an accepted new process) that ``before`` did not."""
    old = {r.iid: r for r in before.records} if before is not None else {}
    out = []
    for rec in after.records:
        if rec.state != "active" or rec.new_process_start is None:
            continue
        prev = old.get(rec.iid)
        if prev is None or prev.state != "active" or prev.new_process_start != rec.new_process_start:
            out.append(rec.iid)
    return sorted(out)


@dataclass
class HoldVersions:
    """Per engine: the first lifecycle version at which it was held out of placement."""

    since: dict[str, int] = field(default_factory=dict)

    def observe(self, section: LifecycleSection, version: int) -> None:
        held = held_out(section)
        for iid in list(self.since):
            if iid not in held:
                del self.since[iid]
        for iid in held:
            self.since.setdefault(iid, version)

    def of(self, iid: str, default: int) -> int:
        return self.since.get(iid, default)


@dataclass(frozen=True)
class FollowResult:
    applied: bool
    reason: str = ""
    readmitted: tuple[str, ...] = ()


class Follower:
    """Applies the holder's committed lifecycle versions to this replica, in order, never backwards."""

    def __init__(
        self,
        core: RouterCore,
        machine: LifecycleMachine,
        readmit: Callable[[str], object] | None = None,
        holds: HoldVersions | None = None,
    ) -> None:
        self.core = core
        self.machine = machine
        self.readmit = readmit or core.scheduler.uneject
        self.version = 0
        self.section: LifecycleSection | None = None
        self.blocked = ""  # non-empty: the last holder state could not be applied (do not place)
        self.holds = holds if holds is not None else HoldVersions()

    def apply(self, version: int, doc: Handoff) -> FollowResult:
        if version <= self.version:
            return FollowResult(False, f"version {version} is not newer than applied {self.version}")
        why = transfer.rejection(doc, self.core)
        if not why and self.section != doc.lifecycle:
            try:
                self.machine.restore(doc.lifecycle, follower=True)
            except LifecycleError as exc:
                why = f"handoff lifecycle rejected: {exc}"
        if why:
            self.blocked = f"cannot follow the holder's lifecycle state: {why}"
            return FollowResult(False, why)
        readmitted = readmitted_between(self.section, doc.lifecycle)
        for iid in readmitted:
            if iid in self.core.scheduler.ejected:
                self.readmit(iid)  # the holder validated it: local breaker evidence is stale
        self.section = doc.lifecycle
        self.version = version
        self.blocked = ""
        self.holds.observe(doc.lifecycle, version)
        self.core.identities_ready = True  # identities are the holder's to validate
        return FollowResult(True, "", tuple(readmitted))
