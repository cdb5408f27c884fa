"""Pure active-active decisions: acknowledgement, stop safety, placement validity, what to report.

No I/O, no sleeps; times come in as arguments (monotonic seconds unless named ``wall``).

- A drain committed at lifecycle version *V* is **acknowledged** when every live replica other
  than the holder reports ``applied_version >= V``. A replica whose key expired is not live: it is
  simply absent from ``members`` (the store deletes the key with its lease).
- An engine is **ready to stop** only when the holder's own lifecycle says so (drained, identity
  recorded, no resident work on the holder) **and** every live replica has applied the engine's
  hold and reports no resident work on it.
- A replica may **place** new work only while its membership key is certainly alive: until
  ``last successful renewal (monotonic, taken before the call) + ttl − safety margin``. So a replica
  whose key can have expired has already stopped placing ("key gone" implies "not placing").
- A replica reports a new ``applied_version`` only once no leg it picked before applying is still
  on its way to an engine the new state holds (``launching``): from the holder's acknowledgement
  on, no replica sends a new leg there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from router.replicas.member import MemberRecord, ResidentWork


@dataclass(frozen=True)
class AckState:
    """Where a drain's acknowledgement stands: ``waiting`` = live replicas still behind."""

    version: int
    waiting: tuple[str, ...] = ()
    applied: Mapping[str, int] = field(default_factory=dict)

    @property
    def acknowledged(self) -> bool:
        return not self.waiting

    def describe(self) -> str:
        """The 503 text when the wait for acknowledgements ran out."""
        behind = ", ".join(f"{rid} (applied {self.applied.get(rid, 0)})" for rid in self.waiting)
        return f"lifecycle version {self.version} not yet applied by replica(s): {behind}"


def others(members: Mapping[str, MemberRecord], self_id: str) -> list[MemberRecord]:
    return [m for rid, m in sorted(members.items()) if rid != self_id]


def ack_state(version: int, members: Mapping[str, MemberRecord], self_id: str) -> AckState:
    behind = [m for m in others(members, self_id) if m.applied_version < version]
    return AckState(
        version=version,
        waiting=tuple(m.replica_id for m in behind),
        applied={m.replica_id: m.applied_version for m in behind},
    )


def remote_resident(iid: str, members: Mapping[str, MemberRecord], self_id: str) -> ResidentWork:
    """ResidentWork work on ``iid`` reported by every live replica except this one."""
    p = d = 0
    for m in others(members, self_id):
        r = m.resident_on(iid)
        p += r.prefill
        d += r.decode
    return ResidentWork(prefill=p, decode=d)


def replicas_clear(iid: str, hold_version: int, members: Mapping[str, MemberRecord], self_id: str) -> bool:
    """Every other live replica has applied the hold of ``iid`` and has nothing resident on it."""
    return all(
        m.applied_version >= hold_version and m.resident_on(iid).total == 0 for m in others(members, self_id)
    )


def ready_to_stop(
    holder_says: bool, iid: str, hold_version: int, members: Mapping[str, MemberRecord], self_id: str
) -> bool:
    return holder_says and replicas_clear(iid, hold_version, members, self_id)


@dataclass
class PlacementValidity:
    """Monotonic deadline of this replica's membership key (like the lease's local validity)."""

    ttl_s: float
    safety_margin_s: float
    deadline: float = -math.inf

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ttl_s) and self.ttl_s > 0):
            raise ValueError("replica key ttl must be finite and positive")
        if not (math.isfinite(self.safety_margin_s) and 0 <= self.safety_margin_s < self.ttl_s):
            raise ValueError("replica key safety margin must be >= 0 and < the ttl")

    def renewed(self, mono_before_call: float) -> None:
        """A keep-alive (or the grant) succeeded; ``mono_before_call`` was read before sending it."""
        self.deadline = max(self.deadline, mono_before_call + self.ttl_s - self.safety_margin_s)

    def lost(self) -> None:
        """The store says the key's lease is gone: stop placing at once."""
        self.deadline = -math.inf

    def can_place(self, now: float) -> bool:
        return now < self.deadline

    def remaining(self, now: float) -> float:
        return max(0.0, self.deadline - now)


def version_to_report(
    applied: int, reported: int, launching: Mapping[str, int], not_accepting: Iterable[str]
) -> int:
    """The ``applied_version`` this replica may publish now.

    ``applied`` is what its placement follows; while a leg picked earlier is still being sent to an
    engine that no longer accepts new work, the previous report stands (the holder keeps waiting).
    """
    if applied <= reported:
        return reported
    if any(launching.get(iid, 0) > 0 for iid in not_accepting):
        return reported
    return applied


@dataclass
class Coalescer:
    """When to publish the membership record: urgent changes now, the rest at most every interval.

    Urgent: the first record, a new applied version or control URL (a drain waits for it), and any
    resident change on an engine that does not accept new work (``ready_to_stop`` waits for it).
    ResidentWork changes on serving engines are coalesced to one write per ``min_interval_s``.
    """

    min_interval_s: float
    published: MemberRecord | None = None
    published_at: float = -math.inf

    def due(self, current: MemberRecord, now: float, urgent_engines: Iterable[str] = ()) -> float | None:
        """``None``: nothing new; ``0.0``: publish now; ``> 0``: publish after that many seconds."""
        last = self.published
        if current.same_content(last):
            return None
        if last is None or current.applied_version != last.applied_version:
            return 0.0
        if current.control_url != last.control_url:
            return 0.0
        if any(current.resident_on(i) != last.resident_on(i) for i in urgent_engines):
            return 0.0
        return max(0.0, self.published_at + self.min_interval_s - now)

    def mark_published(self, record: MemberRecord, now: float) -> None:
        self.published = record
        self.published_at = now
