"""Who controls the fleet: standby / fenced flags and the lease (spec §3.4).

Without a lease a non-standby router controls the fleet (epoch 0, holder "").
"""

from __future__ import annotations

from typing import Protocol


class LeaseView(Protocol):
    """What control needs from a lease: the HA package provides the real one."""

    @property
    def epoch(self) -> int: ...

    @property
    def holder(self) -> str: ...

    @property
    def problem(self) -> str:
        """Damage found in the lease record now ("" = none)."""
        ...

    @property
    def recovered(self) -> str:
        """What the last recovery of a damaged lease record did ("" = none)."""
        ...

    def valid(self) -> bool: ...


class ControlState:
    def __init__(self, lease: LeaseView | None = None, standby: bool = False) -> None:
        self.lease = lease
        self.standby = standby
        self.failover_blocked = ""  # non-empty: fenced, with the reason

    def controls_fleet(self) -> bool:
        return not self.standby and not self.failover_blocked and (self.lease is None or self.lease.valid())

    @property
    def epoch(self) -> int:
        return self.lease.epoch if self.lease is not None and self.controls_fleet() else 0

    @property
    def holder(self) -> str:
        return self.lease.holder if self.lease is not None and self.controls_fleet() else ""

    def fence(self, reason: str) -> None:
        """Lose control for good (until a process restart): a fenced router never re-claims."""
        self.standby = True
        self.failover_blocked = reason or "fenced"

    def take_control(self, lease: LeaseView | None) -> None:
        """A standby that claimed the lease and applied the handoff becomes the active router."""
        self.lease = lease
        self.failover_blocked = ""
        self.standby = False

    def fenced(self) -> bool:
        if self.failover_blocked:
            return True
        return not self.standby and self.lease is not None and not self.lease.valid()

    def not_controlling_reason(self) -> str:
        if self.failover_blocked:
            return self.failover_blocked
        if self.standby:
            return "shadowing"
        if self.lease is not None and not self.lease.valid():
            return "lease expired"
        return ""
