"""The lifecycle service: drain / readmit / recovery handlers over the pure machine (spec §5.2, §6.1).

``router/assemble.py`` hands it to HA as its ``LifecycleView`` (``snapshot() -> LifecycleSection``,
``restore(section)``, ``require_restart_wave``) and registers HA's state-file write in
``persist_hooks``. A single asyncio lock serializes every mutation (drain, readmit, recovery); reads
never wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from router.core import RouterCore
from router.engines.control import EngineControl, describe
from router.lifecycle.document import LifecycleDocument, build_document
from router.lifecycle.machine import LifecycleError, LifecycleMachine, Verdict
from router.lifecycle.models import LifecycleSection
from router.lifecycle.readmission import Readmission
from router.lifecycle.routes import add_lifecycle_routes
from router.replicas.view import ReplicaPicture

log = logging.getLogger("narwhal.lifecycle")
NOT_CONTROLLING = "this router does not control the fleet"
FENCED_DRAIN = "router control was fenced during drain"
FENCED_VALIDATION = "router control was fenced during validation"
VALIDATION_FAILED = "readmission validation failed"

NOT_PERSISTED = "state not persisted"

Result = tuple[int, LifecycleDocument]
# HA's persist: returns once the state is durable; raises (``router.ha.persist.PersistError``) when not
PersistHook = Callable[[], object]


class NotPersisted(RuntimeError):
    """A lifecycle change could not be made durable; the message says where and why."""


class LifecycleService:
    def __init__(
        self,
        core: RouterCore,
        control: EngineControl | None = None,
        eject: Callable[[str, str], object] | None = None,
        replicas: ReplicaPicture | None = None,
    ) -> None:
        self.core = core
        self._owns_control = control is None
        self.control = control or EngineControl(core.config)
        self.control.builds = core.engine_builds
        self.machine = LifecycleMachine(
            core.config, core.scheduler, core.clock, on_event=core.journal.append, residency=replicas
        )
        self.readmission = Readmission(core.config, core.scheduler, self.machine, self.control, eject=eject)
        self.lock = asyncio.Lock()
        self.persist_hooks: list[PersistHook] = []  # HA: write the handoff after lifecycle POSTs
        self.replicas = replicas  # active-active: the replica set's picture (document, residency)

    # -- component protocol (routes live in routes.py) ---------------------------------------
    def add_routes(self, app: Any) -> None:
        add_lifecycle_routes(app, self)

    async def start(self) -> None:
        if self._owns_control:
            await self.control.start()

    async def stop(self) -> None:
        if self._owns_control:
            await self.control.stop()

    # -- HA interface ------------------------------------------------------------------------
    def snapshot(self) -> LifecycleSection:
        return self.machine.snapshot()

    def restore(self, section: LifecycleSection | Mapping[str, Any]) -> None:
        """Strict restore (raises LifecycleError); identities must be re-validated afterwards."""
        self.machine.restore(section)
        if self.core.config.contract_complete:
            self.core.identities_ready = False

    def require_restart_wave(self, reason: str, reset: bool = False) -> bool:
        return self.machine.require_restart_wave(reason, reset)

    # -- views -------------------------------------------------------------------------------
    def document(self, error: str = "") -> LifecycleDocument:
        return build_document(self.machine, self.core, error, self.replicas)

    def _answer(self, status: int, error: str = "") -> Result:
        return status, self.document(error)

    async def _persist(self) -> None:
        """Acknowledged means durable: raises ``NotPersisted`` unless every hook stored the state.

        (The peer ignores persistence errors, spec §5.2 step 6; here a change whose state a
        successor would not find is never answered 200.)
        """
        for hook in list(self.persist_hooks):
            try:
                result = hook()
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                log.error("lifecycle change not persisted: %s", exc)
                text = str(exc) or type(exc).__name__
                raise NotPersisted(
                    text if text.startswith(NOT_PERSISTED) else f"{NOT_PERSISTED}: {text}"
                ) from None

    def _unpersisted(self) -> bool:
        """The last write did not reach where a successor reads (a local-copy-only failure with the
        shared copy written is reported, but does not stop changes)."""
        return self.core.persist_degraded.startswith(NOT_PERSISTED)

    async def _refuse_unpersisted(self) -> Result | None:
        """While the last state write failed, refuse changes until a write succeeds again."""
        if not self._unpersisted():
            return None
        try:
            await self._persist()
        except NotPersisted as exc:
            return self._answer(503, f"{exc}; lifecycle changes refused until a state write succeeds")
        return None

    def _rollback(self, before: LifecycleSection, exc: NotPersisted) -> Result:
        """Undo an unpersisted change in memory: a repeat of the request starts from the same state."""
        self.machine.restore(before)
        return self._answer(503, f"{exc}; change undone, repeat the request")

    # -- drain (spec §5.2) -------------------------------------------------------------------
    async def drain(self, engines: Iterable[str], wave: bool, deadline_s: float) -> Result:
        if not self.core.controls_fleet():
            return self._answer(503, NOT_CONTROLLING)
        engines = list(engines)
        async with self.lock:
            if (refused := await self._refuse_unpersisted()) is not None:
                return refused
            before = self.machine.snapshot()
            try:
                self.machine.begin(engines, wave, deadline_s)  # targets leave placement here
            except LifecycleError as exc:
                return self._answer(409, str(exc))
            pending = self.machine.pending_identity(engines, wave)
            results = await self.readmission.capture(pending) if pending else {}
            failures = {
                iid: err for iid, res in results.items() if (err := self.machine.bind_capture(iid, res))
            }
            try:
                await self._persist()
            except NotPersisted as exc:
                return self._rollback(before, exc)
            if not self.core.controls_fleet():
                return self._answer(503, FENCED_DRAIN)
            if failures:
                return self._answer(503, "; ".join(f"{iid}: {failures[iid]}" for iid in sorted(failures)))
            behind = await self.core.mode.acknowledge()  # active-active: every live replica applied it
            if behind:
                return self._answer(503, behind)
            return self._answer(200)

    # -- readmit (spec §6.1) -----------------------------------------------------------------
    async def readmit(self, engines: Iterable[str], wave: bool) -> Result:
        if not self.core.controls_fleet():
            return self._answer(503, NOT_CONTROLLING)
        engines = list(engines)
        async with self.lock:
            if (refused := await self._refuse_unpersisted()) is not None:
                return refused
            before = self.machine.snapshot()
            try:
                targets = self.machine.mark_validating(engines, wave)
            except LifecycleError as exc:
                return self._answer(409, str(exc))
            try:
                await self._persist()
            except NotPersisted as exc:
                return self._rollback(before, exc)
            ok, fenced = await self._validate(targets, wave)
            try:
                await self._persist()
            except NotPersisted as exc:
                # not readmitted: back to the held state before this request (validate again)
                return self._rollback(before, exc)
            if fenced:
                return self._answer(503, FENCED_VALIDATION)
            return self._answer(200) if ok else self._answer(409, VALIDATION_FAILED)

    async def _validate(self, targets: list[str], wave: bool) -> tuple[bool, bool]:
        """Run the checks and apply the verdicts; returns (readmitted, control lost)."""
        try:
            verdicts = await self.readmission.validate(targets, wave)
        except Exception as exc:
            log.exception("readmission validator raised")
            verdicts = {i: Verdict(errors=[f"validation raised {describe(exc)}"]) for i in targets}
        fenced = not self.core.controls_fleet()
        if fenced:
            verdicts = {i: Verdict(checks=verdicts[i].checks, errors=[FENCED_VALIDATION]) for i in targets}
        return self.machine.complete_validation(verdicts), fenced

    # -- automatic recovery (spec §6.7, §7.3) ------------------------------------------------
    async def recover(self, engines: list[str], wave: bool = False) -> bool:
        """Validate ejected engines on their running processes; True when readmitted."""
        if not self.core.controls_fleet() or self.lock.locked() or self._unpersisted():
            return False  # no automatic change while state cannot be persisted
        async with self.lock:
            before = self.machine.snapshot()
            try:
                targets = self.machine.start_recovery(engines, wave)
            except LifecycleError:
                return False
            try:
                await self._persist()
            except NotPersisted:
                self.machine.restore(before)
                return False
            ok, _ = await self._validate(targets, wave)
            with contextlib.suppress(NotPersisted):  # acknowledged to no one: a successor that
                await self._persist()  # misses it sees the engine ejected (the safe side)
            return ok
