"""Readmission validation (spec §6.2–6.6): the ordered checks, run through ``engines/control``.

Participants are the targets plus their fabric peers. Gate steps (health, identity, attestation,
model) run for every participant; the restart check and the direct generation for targets only.
Any gate failure ends the validation before fabric traffic. Identities are re-verified before and
after every prefill leg and at the end; a change there ejects the engine (``process_identity``).

Without an ``engine_contract`` the attestation step is reported as ``attestation not configured``
and everything else still runs (the peer refuses such fleets; spec §16.3).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from router.attestation import contract_fingerprint, verify_attestation
from router.config import FleetConfig
from router.engines.control import EngineControl, Identity, describe
from router.engines.identity import newer_process, same_process
from router.lifecycle.machine import LifecycleMachine, Verdict
from router.lifecycle.pairs import Pair, PairError, recovery_pairs, validation_pairs
from router.scheduler import Scheduler

NOT_RESTARTED = "engine process did not restart after drain"
PEER_CHANGED = "peer process changed before readmission"


@dataclass
class _Run:
    iid: str
    target: bool
    checks: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    identity: Identity | None = None


def _verdict(run: _Run) -> Verdict:
    start = run.identity.process_start if run.identity is not None else None
    return Verdict(checks=run.checks, errors=run.errors, process_start=start)


class _IdentityChanged(Exception):
    pass


class Readmission:
    def __init__(
        self,
        config: FleetConfig,
        scheduler: Scheduler,
        machine: LifecycleMachine,
        control: EngineControl,
        eject: Callable[[str, str], object] | None = None,
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.machine = machine
        self.control = control
        self.eject = eject or scheduler.eject
        contract = config.engine_contract
        self.contract: Mapping[str, Any] | None = contract
        self.attestation_label = (
            f"attestation {contract_fingerprint(contract)}"
            if contract is not None
            else "attestation not configured"
        )

    # -- drain: pre-restart identity capture (spec §5.2 step 4) ------------------------------
    async def capture(self, targets: list[str]) -> dict[str, float | str]:
        async def one(iid: str) -> float | str:
            try:
                return (await self.control.identity(iid)).process_start
            except Exception as exc:
                return f"process identity unreadable: {describe(exc)}"

        results = await asyncio.gather(*(one(i) for i in targets))
        return dict(zip(targets, results, strict=True))

    # -- readmission ------------------------------------------------------------------------
    def _precheck(self, targets: list[str], wave: bool) -> str:
        if self.machine.policy == "whole_wave":
            if not wave or targets != self.config.engine_ids:
                return "engine_restart_policy requires whole-wave readmission"
            for iid in targets:
                rec = self.machine.records.get(iid)
                if rec is None or not rec.restart_required or rec.old_process_start is None:
                    return "whole-wave recovery requires recorded pre-restart identities"
        return ""

    def _pairs(self, targets: list[str], wave: bool) -> list[Pair]:
        engines = self.scheduler.engines
        if len(engines) == 1:
            return []
        if wave or len(targets) > 1:
            return validation_pairs([engines[i] for i in targets])
        peers = [e for e in self.scheduler.eligible() if e.iid not in targets]
        return recovery_pairs(engines[targets[0]], peers)

    async def validate(self, targets: list[str], wave: bool) -> dict[str, Verdict]:
        targets = sorted(targets)
        error = self._precheck(targets, wave)
        try:
            pairs = [] if error else self._pairs(targets, wave)
        except PairError as exc:
            error = str(exc)
        if error:
            return {iid: Verdict(errors=[error]) for iid in targets}
        runs = {iid: _Run(iid, target=True) for iid in targets}
        for src, dst in pairs:
            for iid in (src, dst):
                runs.setdefault(iid, _Run(iid, target=False))
        await asyncio.gather(*(self._gate(r) for r in runs.values()))
        self._share_peer_failures(runs, pairs)
        if not any(runs[i].errors for i in targets):
            await self._fabric_and_final(runs, pairs, targets)
        return {iid: _verdict(runs[iid]) for iid in targets}

    async def _gate(self, run: _Run) -> None:
        """Steps 1-7 for one participant (labels only for targets)."""
        iid, c = run.iid, self.control
        if not await c.health(iid):
            run.errors.append("health did not answer 200")
            return
        run.checks.append("health")
        try:
            run.identity = await c.identity(iid)
        except Exception as exc:
            run.errors.append(f"process identity unreadable: {describe(exc)}")
            return
        if not run.target:
            accepted = self.machine.process_starts.get(iid)
            if accepted is not None and not same_process(accepted, run.identity.process_start):
                self._exclude(iid, accepted, run.identity.process_start)
                run.errors.append(PEER_CHANGED)
                return
        failures = await self._attest(iid, run.identity)
        if failures is None:
            return run.errors.append("attestation_url is not configured")
        if failures:
            run.errors.append(failures)
            if failures.startswith("attestation unreadable"):
                return
        else:
            run.checks.append(self.attestation_label)
        try:
            served = await c.models(iid)
        except Exception as exc:
            run.errors.append(f"model list unreadable: {describe(exc)}")
        else:
            if self.config.model in served:
                run.checks.append("model")
            else:
                run.errors.append(f"serves {served}, expected {self.config.model}")
        if not run.target or run.errors:
            return
        rec = self.machine.records.get(iid)
        if rec is not None and rec.restart_required:
            old = rec.old_process_start
            if not newer_process(run.identity.process_start, old):
                run.errors.append(NOT_RESTARTED)
                return
            run.checks.append("new process identity")
        else:
            run.checks.append("process identity")
        try:
            await c.generate(iid)
        except Exception as exc:
            run.errors.append(f"generation failed: {describe(exc)}")
            return
        run.checks.append("generation")

    async def _attest(self, iid: str, identity: Identity) -> str | None:
        """Empty text = ok (or not configured), None = no URL, else the failure text."""
        if self.contract is None:
            return ""
        if not self.config.engine_by_id(iid).attestation_url:
            return None
        try:
            doc = await self.control.attestation(iid)
        except Exception as exc:
            return f"attestation unreadable: {describe(exc)}"
        failures = verify_attestation(doc, self.contract, identity.version, identity.process_start)
        return f"attestation: {'; '.join(failures)}" if failures else ""

    def _share_peer_failures(self, runs: dict[str, _Run], pairs: list[Pair]) -> None:
        for src, dst in pairs:
            for peer, target in ((src, dst), (dst, src)):
                p, t = runs[peer], runs[target]
                if not p.target and t.target and p.errors:
                    t.errors += [e if e == PEER_CHANGED else f"peer {peer}: {e}" for e in p.errors]

    def _exclude(self, iid: str, previous: float | None, observed: float | None) -> None:
        self.machine.note_process_excluded(iid, previous, observed)
        self.eject(iid, "process_identity")

    async def _reverify(self, runs: dict[str, _Run]) -> None:
        async def one(run: _Run) -> None:
            try:
                now = await self.control.identity(run.iid)
                before = run.identity
                if (
                    before is None
                    or now.version != before.version
                    or not same_process(now.process_start, before.process_start)
                ):
                    raise _IdentityChanged("process start changed")
                problem = await self._attest(run.iid, now)
                if problem:
                    raise _IdentityChanged(problem)
            except Exception as exc:
                previous = run.identity.process_start if run.identity else None
                self._exclude(run.iid, previous, None)
                if self.machine.policy == "whole_wave":
                    self.machine.require_restart_wave(
                        "process identity changed during validation", reset=True
                    )
                detail = str(exc) if isinstance(exc, _IdentityChanged) else describe(exc)
                raise _IdentityChanged(
                    f"identity changed or unavailable during validation: {detail}"
                ) from None

        await asyncio.gather(*(one(r) for r in runs.values()))

    async def _fabric_and_final(self, runs: dict[str, _Run], pairs: list[Pair], targets: list[str]) -> None:
        def fail(message: str, ends: tuple[str, ...] = tuple(targets)) -> None:
            hit = [i for i in ends if runs[i].target] or targets
            for iid in hit:
                runs[iid].errors.append(message)

        try:
            if not pairs:
                for iid in targets:
                    runs[iid].checks.append("fabric not applicable: single-engine fleet")
            for src, dst in pairs:
                await self._reverify(runs)
                try:
                    descriptor = await self.control.fabric_prefill(src)
                    await self._reverify(runs)
                    await self.control.fabric_decode(dst, descriptor)
                except _IdentityChanged:
                    raise
                except Exception as exc:
                    return fail(f"fabric {src}->{dst}: {describe(exc)}", (src, dst))
                if runs[src].target:
                    runs[src].checks.append(f"fabric produce to {dst}")
                if runs[dst].target:
                    runs[dst].checks.append(f"fabric consume from {src}")
            healthy = await asyncio.gather(*(self.control.health(i) for i in targets))
            for iid, ok in zip(targets, healthy, strict=True):
                if ok:
                    runs[iid].checks.append("final health")
                else:
                    runs[iid].errors.append("final health failed after fabric validation")
            await self._reverify(runs)
        except _IdentityChanged as exc:
            fail(str(exc))
