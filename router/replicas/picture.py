"""The replica set as one replica sees it (pure state; the I/O lives in ``router/replicas/service.py``).

``ReplicaSet`` holds the live membership records (from the store's watch), knows who holds
control, builds this replica's own record from its scheduler, and answers the questions the
lifecycle asks in active-active mode:

- ``resident(iid)`` — resident work on an engine over this replica and every live one (the
  lifecycle's ``drained`` transition and the document's ``engines.*.resident``);
- ``stop_gate(iid)`` — every other live replica applied the engine's hold and has nothing resident
  on it (``ready_to_stop``);
- ``ack(version)`` — which live replicas have not applied a commit yet (the drain's 200 waits);
- ``section()`` — the document's ``replicas`` section.

It is the lifecycle's ``ReplicaPicture`` and its machine's ``Residency``, given to
``LifecycleService`` at assembly (``router/replicas/wiring.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

from router.clock import Clock
from router.replicas import rules
from router.replicas.follow import HoldVersions
from router.replicas.member import MemberRecord, ResidentWork, residents_from
from router.replicas.view import ReplicasSection, build_section
from router.scheduler import Scheduler


class ReplicaSet:
    def __init__(self, scheduler: Scheduler, clock: Clock, self_id: str, control_url: str) -> None:
        if not self_id:
            raise ValueError("replica id must not be empty")
        self.scheduler = scheduler
        self.clock = clock
        self.self_id = self_id
        self.control_url = control_url
        self.members: dict[str, MemberRecord] = {}  # live keys, this replica's own included
        self.holder_id = ""
        self.version = 0  # lifecycle version this replica's placement follows
        self.reported = 0  # applied_version last put in this replica's own record
        self.holds = HoldVersions()

    # -- membership (fed by the watch) ------------------------------------------------------
    def member_put(self, record: MemberRecord) -> None:
        self.members[record.replica_id] = record

    def member_gone(self, replica_id: str) -> None:
        self.members.pop(replica_id, None)

    def replace_members(self, records: Mapping[str, MemberRecord]) -> None:
        self.members = dict(records)

    # -- this replica -----------------------------------------------------------------------
    def local_resident(self) -> dict[str, tuple[int, int]]:
        return {iid: (e.resident_prefill, e.resident_decode) for iid, e in self.scheduler.engines.items()}

    def launching(self) -> dict[str, int]:
        """Legs picked but maybe not yet received by their engine (prefill legs, opening decodes)."""
        return {iid: e.resident_prefill + e.opening_decode for iid, e in self.scheduler.engines.items()}

    def not_accepting(self) -> list[str]:
        return [iid for iid in self.scheduler.engines if not self.scheduler.accepts_new(iid)]

    def reportable_version(self) -> int:
        return rules.version_to_report(self.version, self.reported, self.launching(), self.not_accepting())

    def own_record(self) -> MemberRecord:
        """The record this replica would publish now (``applied_version`` per ``version_to_report``)."""
        return MemberRecord(
            replica_id=self.self_id,
            control_url=self.control_url,
            applied_version=self.reportable_version(),
            resident=residents_from(self.local_resident()),
            updated_at=self.clock.wall(),
        )

    def published(self, record: MemberRecord) -> None:
        self.reported = max(self.reported, record.applied_version)

    # -- questions the lifecycle asks -------------------------------------------------------
    def resident(self, iid: str) -> ResidentWork:
        local = self.scheduler.engines[iid]
        remote = rules.remote_resident(iid, self.members, self.self_id)
        return ResidentWork(
            prefill=local.resident_prefill + remote.prefill, decode=local.resident_decode + remote.decode
        )

    def resident_total(self, iid: str) -> int:
        return self.resident(iid).total

    def stop_gate(self, iid: str) -> bool:
        hold = self.holds.of(iid, self.version)
        return rules.replicas_clear(iid, hold, self.members, self.self_id)

    def ack(self, version: int) -> rules.AckState:
        return rules.ack_state(version, self.members, self.self_id)

    def section(self) -> ReplicasSection:
        mine = self.own_record()
        return build_section(mine, self.members, self.holder_id, self.clock.wall())
