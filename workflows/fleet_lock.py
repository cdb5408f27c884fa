"""One restart owner per fleet: the ``FleetLock`` workflow and how a run takes it.

Where every start path meets: whatever starts a restart run (``narwhal-restart start``, a Schedule,
the UI's "start workflow", a direct Temporal client, another ``--fleet`` name for the same routers),
the run's first activity is the worker's preflight, which reads the fleet's canonical identity from
the router (``fleet_identity``: every engine's ``iid=URL`` as the router lists it), and the run then
starts a ``FleetLock`` child with the fixed id ``narwhal-fleet-lock-<identity>`` — before anything
is drained. Temporal runs at most one workflow per id, so a second run's child start fails
(``WorkflowAlreadyStartedError``) and that run ends Failed with one line naming the owner, its state
and how to steer it, having touched nothing.

Lifetime: the lock is server state (it survives worker, router and Temporal restarts with a
persistent Temporal). It is released when the owner ends, however it ends: the owner signals
``release`` on its way out, and the child's parent-close policy TERMINATE ends it when the owner
closes any other way (failed, canceled, terminated, timed out). A run killed for good is
terminated (``temporal workflow terminate --workflow-id <owner>``) and frees the fleet with it.
Breaking the lock itself (terminating ``narwhal-fleet-lock-…``) makes its owner stop at the next
safe point between engines ("fleet lock lost").
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from narwhal_models.restart import FleetLockInput


@workflow.defn(name="FleetLock")
class FleetLock:
    @workflow.init
    def __init__(self, inp: FleetLockInput) -> None:
        self.inp = inp
        self.released = False

    @workflow.run
    async def run(self, inp: FleetLockInput) -> str:
        workflow.set_current_details(
            f"### fleet lock held by `{inp.owner}`\n\nfleet `{inp.fleet}`, identity `{inp.identity}`: "
            "no other restart may drain, restart or readmit its engines until this run ends."
        )
        await workflow.wait_condition(lambda: self.released)
        return f"released by {inp.owner}"

    @workflow.signal
    def release(self) -> None:
        self.released = True

    @workflow.query
    def holder(self) -> FleetLockInput:
        return self.inp
