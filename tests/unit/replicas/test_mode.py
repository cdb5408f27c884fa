"""The control mode seam: readiness, placement and recovery follow the mode chosen at assembly."""

from __future__ import annotations

from router.clock import FakeClock
from router.config import parse_fleet
from router.control_mode import ActivePassive
from router.core import RouterCore
from router.ha.etcd_client import EtcdClient
from router.journal import Journal
from router.lifecycle.service import LifecycleService
from router.replicas.mode import ActiveActive
from router.replicas.service import NO_STATE, NOT_REGISTERED, ReplicaService, ReplicaSettings, replica_set


def replica(controls: bool) -> tuple[RouterCore, ActiveActive]:
    fleet = parse_fleet(
        {"model": "fake", "engines": [{"iid": f"e{i}", "url": f"http://127.0.0.1:9/{i}"} for i in range(2)]}
    )
    core = RouterCore(config=fleet, journal=Journal(None), clock=FakeClock())
    core.control.standby = not controls
    settings = ReplicaSettings(prefix="/narwhal/fake/", replica_id="r1", control_url="http://r1.test")
    replicas = replica_set(core, settings)
    lifecycle = LifecycleService(core, replicas=replicas)
    service = ReplicaService(core, lifecycle, EtcdClient("http://127.0.0.1:9"), settings, replicas=replicas)
    mode = ActiveActive(service)
    core.mode = mode  # what assembly does (router/assemble.py)
    return core, mode


async def contracted(iid: str) -> bool:
    return True


def test_a_replica_serves_by_its_key_and_the_holders_state_not_by_control_of_the_fleet() -> None:
    core, mode = replica(controls=False)
    assert not core.ready() and core.ready_reason() == NOT_REGISTERED
    assert core.prefill_hold_reason() == NOT_REGISTERED
    mode.service.validity.renewed(core.clock.monotonic())
    mode.service.registered = True
    assert core.ready_reason() == NO_STATE  # a follower waits for the holder's first commit
    mode.service.follower.version = 1
    assert core.ready() and core.ready_reason() == "" and core.prefill_hold_reason() == ""
    core.control.standby = True  # a standby in active-passive mode would say "shadowing"
    assert core.health_status() == "ok"


def test_a_follower_recovers_by_identity_and_the_holder_through_the_lifecycle() -> None:
    core, mode = replica(controls=False)
    assert mode.recovers_own_ejections
    assert mode.recovery_validator(contracted) == mode.recover_local
    assert mode.recovery_validator(None) is None  # contract-free fleets: the health probe path
    core.control.standby = False  # this replica holds the lease now
    assert mode.recovery_validator(contracted) is contracted
    passive = ActivePassive()
    assert not passive.recovers_own_ejections and passive.recovery_validator(contracted) is contracted
