"""Active-active as a control mode (``router.control_mode.ControlMode``): every replica serves.

- **readiness / placement**: a replica places new work while its membership key is certainly alive
  and it follows the holder's committed state (``ReplicaService.placement_reason``), then the holds
  every replica follows (fleet hold; the holder's monitoring; identity validation);
- **acknowledgement**: the holder's drain answers 200 once every live replica applied the commit
  (``ReplicaService.acknowledge``);
- **adoption**: a takeover adopts the stored lifecycle only (``ReplicaService.adopt``);
- **recovery**: breaker evidence is each replica's own, so every replica probes its ejections; on
  a follower, a contracted fleet's engine comes back when it answers ``/health`` with the process
  start the holder accepted (``recover_local``), never by a local lifecycle mutation.
"""

from __future__ import annotations

import logging

from router.control_mode import Apply, CoreView, Validator
from router.ha.handoff import Handoff
from router.replicas.service import ReplicaService

log = logging.getLogger("narwhal.replicas")


class ActiveActive:
    name = "active-active"
    recovers_own_ejections = True

    def __init__(self, service: ReplicaService) -> None:
        self.service = service

    # -- readiness and the placement gate -----------------------------------------------------
    def _reason(self, core: CoreView) -> str:
        """The replica gate, then the holds every replica follows."""
        why = self.service.placement_reason()
        if why:
            return why
        if core.scheduler.fleet_hold:
            return core.scheduler.fleet_hold
        if core.controls_fleet() and core.monitoring_degraded:
            return f"monitoring degraded: {core.monitoring_degraded}"
        if not core.identities_ready:
            return "engine identity validation pending"
        return ""

    def ready(self, core: CoreView) -> bool:
        return not self._reason(core) and bool(core.scheduler.eligible())

    def ready_reason(self, core: CoreView) -> str:
        return self._reason(core) or ("" if core.scheduler.eligible() else "no available engines")

    def prefill_hold_reason(self, core: CoreView) -> str:
        why = self.service.placement_reason()
        if why or not (core.controls_fleet() and core.monitoring_degraded):
            return why
        return f"monitoring degraded: {core.monitoring_degraded}"

    # -- recovery -----------------------------------------------------------------------------
    def recovery_validator(self, contracted: Validator | None) -> Validator | None:
        """The holder validates through the lifecycle; a follower checks the accepted identity."""
        if contracted is None or self.service.core.controls_fleet():
            return contracted
        return self.recover_local

    async def recover_local(self, iid: str) -> bool:
        """A follower's recovery of an engine its own breaker ejected (contracted fleets)."""
        core, lifecycle = self.service.core, self.service.lifecycle
        accepted = lifecycle.machine.process_starts.get(iid)
        if accepted is None or iid in core.scheduler.draining or core.scheduler.fleet_hold:
            return False  # held by the holder's lifecycle: only the holder readmits it
        if not await lifecycle.control.health(iid):
            return False
        try:
            identity = await lifecycle.control.identity(iid)
        except Exception as exc:
            log.info("engine %s identity unreadable during local recovery: %s", iid, type(exc).__name__)
            return False
        return identity.process_start == accepted

    # -- acknowledgement and adoption ---------------------------------------------------------
    async def acknowledge(self) -> str:
        return await self.service.acknowledge()

    def adopt(self, doc: Handoff, apply: Apply) -> tuple[bool, str]:
        return self.service.adopt(doc)  # the lifecycle only: never ``apply`` (the whole handoff)
