"""The additive ``replicas`` section of the lifecycle document (active-active mode only).

It shows the whole replicated router from any replica: who holds control, the lifecycle version
the holder committed last, and every live replica with its control URL, the version it applied,
its resident work per engine and the age of its last membership update. In active-passive mode the
section is absent and the document is the peer's, unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from router.replicas.member import MemberRecord, ResidentWork


class ReplicaPicture(Protocol):
    """What the lifecycle needs from the replica set (``router/replicas/picture.py``): the
    document's ``replicas`` section and resident work, and the machine's ``Residency``."""

    def resident(self, iid: str) -> ResidentWork:
        """ResidentWork work on ``iid`` summed over this replica and every live one."""
        ...

    def section(self) -> ReplicasSection: ...

    def resident_total(self, iid: str) -> int: ...

    def stop_gate(self, iid: str) -> bool:
        """Every other live replica applied the engine's hold and has nothing resident on it."""
        ...


class ReplicaView(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    url: str = Field(description="control URL of the replica")
    holder: bool = Field(description="this replica holds the lease and controls the fleet")
    applied_version: int = Field(ge=0)
    resident: dict[str, ResidentWork] = Field(
        description="resident work per engine (engines with none omitted)"
    )
    last_update_age_s: float = Field(ge=0, description="seconds since the replica last updated its key")


class ReplicasSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: str = Field(default="active-active")
    self_id: str = Field(description="the replica that answered")
    holder_id: str = Field(description="replica id of the lease holder, empty when none is known")
    holder_url: str = Field(description="control URL of the lease holder (send lifecycle POSTs there)")
    version: int = Field(ge=0, description="lifecycle version this replica has applied")
    members: list[ReplicaView]


def build_section(
    self_record: MemberRecord,
    members: Mapping[str, MemberRecord],
    holder_id: str,
    now_wall: float,
) -> ReplicasSection:
    """``members`` = live membership keys (this replica's own may lag: its live record wins)."""
    rows = dict(members)
    rows[self_record.replica_id] = self_record
    holder = rows.get(holder_id)
    views = [
        ReplicaView(
            id=rid,
            url=m.control_url,
            holder=rid == holder_id,
            applied_version=m.applied_version,
            resident=dict(m.resident),
            last_update_age_s=round(max(0.0, now_wall - m.updated_at), 3),
        )
        for rid, m in sorted(rows.items())
    ]
    return ReplicasSection(
        self_id=self_record.replica_id,
        holder_id=holder_id if holder is not None else "",
        holder_url=holder.control_url if holder is not None else "",
        version=self_record.applied_version,
        members=views,
    )
