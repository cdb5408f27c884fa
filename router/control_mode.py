"""How this router takes part in controlling the fleet: the control mode (chosen at assembly).

``ControlMode`` is everything that differs between the two modes, behind one typed seam:

- **readiness** (``ready`` / ``ready_reason``, spec §3.4) and the **placement gate**
  (``prefill_hold_reason``): active-passive serves while it controls the fleet; active-active
  serves on every replica whose membership key is alive and that follows the holder's state;
- **acknowledgement** (``acknowledge``): what a drain's 200 waits for after the state is durable
  (active-passive: nothing; active-active: every live replica applied the commit);
- **adoption** (``adopt``): what a takeover takes from a stored handoff (active-passive: all of it,
  ``apply``; active-active: the lifecycle only — counters and breaker evidence stay per replica);
- **recovery** (``recovers_own_ejections``, ``recovery_validator``): whether the prober's periodic
  pass runs on a router that does not control the fleet, and which validator readmits an engine.

``ActivePassive`` is the default (``RouterCore.mode``); ``router/replicas/mode.py`` has
``ActiveActive``. ``router/assemble.py`` picks one; components ask the mode, never which mode.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from router.ha.control import ControlState
    from router.ha.handoff import Handoff
    from router.scheduler import Scheduler

# a contracted fleet's readmission check of one engine (the lifecycle monitor's ``recover``)
Validator = Callable[[str], Awaitable[bool]]
# ``ha.transfer.Handover.apply``: restore a whole handoff; (applied, why)
Apply = Callable[["Handoff"], tuple[bool, str]]


class CoreView(Protocol):
    """What a mode reads of the router's core (``core.RouterCore``)."""

    control: ControlState
    scheduler: Scheduler
    identities_ready: bool
    monitoring_degraded: str

    def controls_fleet(self) -> bool: ...

    def control_ready(self) -> bool: ...


class ControlMode(Protocol):
    @property
    def name(self) -> str:
        """``active-passive`` or ``active-active`` (``ha.mode``)."""
        ...

    @property
    def recovers_own_ejections(self) -> bool:
        """The prober's recovery pass runs even while this router does not control the fleet."""
        ...

    def ready(self, core: CoreView) -> bool: ...

    def ready_reason(self, core: CoreView) -> str:
        """Why /ready is 503, in the peer's precedence order; "" when ready."""
        ...

    def prefill_hold_reason(self, core: CoreView) -> str:
        """Why a new prefill placement is refused right now ("" = allowed)."""
        ...

    def recovery_validator(self, contracted: Validator | None) -> Validator | None:
        """The validator that readmits an ejected engine now (None: the contract-free probe);
        ``contracted`` is the lifecycle's (set on contracted fleets)."""
        ...

    async def acknowledge(self) -> str:
        """After a durable drain: "" once it is acknowledged, else why not (the drain's 503)."""
        ...

    def adopt(self, doc: Handoff, apply: Apply) -> tuple[bool, str]:
        """A claim after another holder: take over what this mode takes of its stored handoff."""
        ...


class ActivePassive:
    """One router serves and controls the fleet; a standby or contender waits for the lease."""

    name = "active-passive"
    recovers_own_ejections = False

    def ready(self, core: CoreView) -> bool:
        return (
            core.control_ready()
            and core.identities_ready
            and not core.scheduler.fleet_hold
            and bool(core.scheduler.eligible())
        )

    def ready_reason(self, core: CoreView) -> str:
        control, sched = core.control, core.scheduler
        if control.failover_blocked:
            return control.failover_blocked
        if sched.fleet_hold:
            return sched.fleet_hold
        if core.monitoring_degraded:
            return f"monitoring degraded: {core.monitoring_degraded}"
        if control.standby:
            return "shadowing"
        if not core.controls_fleet():
            return "lease expired"
        if not core.identities_ready:
            return "engine identity validation pending"
        if not sched.eligible():
            detail = "; ".join(f"{iid} {why}" for iid, why in sorted(sched.excluded.items()))
            return f"no available engines ({detail})" if detail else "no available engines"
        return ""

    def prefill_hold_reason(self, core: CoreView) -> str:
        control = core.control
        if not core.controls_fleet():
            return control.failover_blocked or (
                "standby: the primary router is serving" if control.standby else "lease expired"
            )
        if core.monitoring_degraded:
            return f"monitoring degraded: {core.monitoring_degraded}"
        return ""

    def recovery_validator(self, contracted: Validator | None) -> Validator | None:
        return contracted

    async def acknowledge(self) -> str:
        return ""

    def adopt(self, doc: Handoff, apply: Apply) -> tuple[bool, str]:
        return apply(doc)
