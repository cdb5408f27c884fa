"""HA control as one pure state machine: events in, effects out (the style of ``lease.py`` rules and
``router/breaker.py``). No I/O, no clock: every event carries ``now`` and every store answer.

One takeover path, whoever gains control — the returning primary at start-up (``START``), a warm
standby whose primary stopped answering (``STANDBY``), an etcd router contending for a vacant
holder key (``CONTEND``) and a controller re-claiming after a local store error (``RECLAIM``);
an active-active replica takes the same path (its shell applies with ``adopt``):

    Claim(floor) ──Claimed──▶ ReadHandoff ──read──▶ Apply(doc)? ──▶ Activate ──▶ controlling
        │ Held / store error                │ unreadable: read again; lease ran out: Release, retry
        ▼                                   ▼ doc epoch ≥ claimed epoch / apply refused: fenced
    per entry: shadow on (standby), contend (etcd), wait out / fence (file lease at start)

The handoff is read *after* the claim: once the claim commits nobody else can write a fenced
handoff, so the document read then holds every change any earlier controller acknowledged (they
are persisted before they are acknowledged). A standby's polled snapshot is only used when it is
newer (``freshest``). While controlling: ``Renew`` every ``renew_every``; a real loss fences (etcd:
contend again); a store error is retried while the lease is locally valid and then re-claimed
(``RECLAIM``). A lifecycle change is acknowledged only after the ``Persist`` carrying it succeeded.

The asyncio shell runs each effect and feeds the result back as the next event.
``tests/unit/ha/test_interleavings.py`` explores every interleaving of 2 routers running this
machine on a simulated store with faults (kill, freeze, partition, TTL expiry, store errors, torn
writes) to a bounded depth and checks the invariants (docs/ha.md, "The control machine").
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Generic, Protocol, TypeVar

RENEWAL_FAILED = "lease renewal failed"
HELD_ELSEWHERE = "lease held by another router"
NO_FRESH_HANDOFF = "no fresh handoff"


class EpochDoc(Protocol):
    """What the machine reads of a handoff document (``router.ha.handoff.Handoff``)."""

    @property
    def epoch(self) -> int: ...

    @property
    def at(self) -> float: ...


D = TypeVar("D", bound=EpochDoc)


class Entry(Enum):
    START = "start"  # the returning primary: start-up claim (file lease: wait out a held record)
    STANDBY = "standby"  # warm standby: its primary missed enough probes
    CONTEND = "contend"  # etcd: the holder key may be vacant (lost, or held by someone else)
    RECLAIM = "reclaim"  # our lease ran out on a local store error: claim above it again


class Phase(Enum):
    IDLE = "idle"
    SHADOW = "shadowing"  # standby: probing the primary
    WAIT = "waiting"  # not controlling; the next attempt is due at ``due``
    CLAIM = "claiming"
    READ = "reading"
    APPLY = "applying"
    ACTIVATE = "activating"
    CONTROL = "controlling"
    FENCED = "fenced"  # for good (until a process restart)


@dataclass(frozen=True)
class Rules:
    """Static per router: its role and the lease backend's behaviour."""

    standby: bool = False  # --standby-of
    contends: bool = False  # ControlLease.reclaims (etcd): never fenced for good by a live holder
    takeover_after: int = 3  # missed probes before a standby takes over
    probe_every: float = 1.0
    renew_every: float = 1.0
    retry_every: float = 0.25


# -- events ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Started:
    now: float


@dataclass(frozen=True)
class Tick:
    now: float


@dataclass(frozen=True)
class Enter:
    """An entry's trigger decided by its shell (a standby's misses counted by its probe loop, an
    etcd holder key found vacant, a renewal lost to a store error): take the one takeover path."""

    now: float
    entry: Entry


@dataclass(frozen=True)
class Probed(Generic[D]):
    """A standby's poll of its primary: the lease-validated snapshot, or None (a miss)."""

    now: float
    doc: D | None
    reason: str = ""


@dataclass(frozen=True)
class Claimed:
    now: float
    epoch: int
    previous_epoch: int  # the record's epoch before our claim
    valid_until: float  # local (monotonic) validity


@dataclass(frozen=True)
class Held:
    """A live holder owns the lease (its epoch and expiry as read)."""

    now: float
    epoch: int
    expires_at: float


@dataclass(frozen=True)
class StoreFailed:
    """The store could not be reached (or the lease record is damaged): not a verdict."""

    now: float
    reason: str


@dataclass(frozen=True)
class HandoffRead(Generic[D]):
    now: float
    kind: str  # "ok" | "missing" | "damaged" | "unreadable"
    doc: D | None = None
    reason: str = ""  # why the durable copy is damaged or unreadable
    poll_fresh: bool = True  # standby: its polled snapshot is young enough to use without a durable copy


@dataclass(frozen=True)
class Applied:
    now: float
    ok: bool
    why: str = ""


@dataclass(frozen=True)
class Activated:
    now: float
    ok: bool
    why: str = ""


@dataclass(frozen=True)
class Renewed:
    now: float
    valid_until: float


@dataclass(frozen=True)
class RenewLost:
    now: float


@dataclass(frozen=True)
class ChangeRequested:
    now: float
    token: int


@dataclass(frozen=True)
class Persisted:
    now: float
    ok: bool
    tokens: tuple[int, ...] = ()


Event = (
    Started
    | Tick
    | Enter
    | Probed[D]
    | Claimed
    | Held
    | StoreFailed
    | HandoffRead[D]
    | Applied
    | Activated
    | Renewed
    | RenewLost
    | ChangeRequested
    | Persisted
)


# -- effects --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Probe:
    pass


@dataclass(frozen=True)
class Claim:
    floor: int


@dataclass(frozen=True)
class ReadHandoff:
    pass


@dataclass(frozen=True)
class Apply(Generic[D]):
    """Apply the handoff (active-active: adopt its lifecycle) — the shell's one apply call site."""

    doc: D
    entry: Entry


@dataclass(frozen=True)
class Activate:
    """Take control (identity validation, loops)."""

    epoch: int


@dataclass(frozen=True)
class Renew:
    pass


@dataclass(frozen=True)
class Release:
    pass


@dataclass(frozen=True)
class Persist:
    epoch: int
    tokens: tuple[int, ...] = ()


@dataclass(frozen=True)
class Ack:
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Refuse:
    tokens: tuple[int, ...]
    reason: str


@dataclass(frozen=True)
class Report:
    """What /ready and /narwhal/state say: controlling, or why not."""

    controlling: bool
    reason: str


Effect = Probe | Claim | ReadHandoff | Apply[D] | Activate | Renew | Release | Persist | Ack | Refuse | Report


@dataclass(frozen=True)
class Control(Generic[D]):
    phase: Phase = Phase.IDLE
    entry: Entry = Entry.START
    epoch: int = 0  # the epoch held (claimed; controlling once CONTROL)
    previous: int = 0  # the epoch this router held before (RECLAIM / CONTEND after a loss)
    record_previous: int = 0  # the lease record's epoch before our claim
    valid_until: float = 0.0
    due: float = 0.0  # next probe / attempt / renewal
    renewing: bool = False
    misses: int = 0
    polled: D | None = None  # standby: the newest lease-validated snapshot
    seen: int = 0  # highest handoff epoch seen: every claim goes above it
    waited: tuple[int, float] | None = None  # file lease at start: the held record waited out
    reason: str = ""
    refusals: int = 0  # takeovers refused (a bad handoff, identity validation): counted by ``_fence``

    def controls(self, now: float) -> bool:
        return self.phase is Phase.CONTROL and now < self.valid_until


Step = tuple[Control[D], tuple[Effect[D], ...]]


def freshest(polled: D | None, durable: D | None) -> D | None:
    """The newer (epoch, then ``at``) of a polled snapshot and the durable handoff."""
    if durable is None:
        return polled
    if polled is None or (durable.epoch, durable.at) >= (polled.epoch, polled.at):
        return durable
    return polled


def _report(c: Control[D]) -> Report:
    return Report(c.phase is Phase.CONTROL, "" if c.phase is Phase.CONTROL else c.reason or c.phase.value)


def begin(rules: Rules, c: Control[D], entry: Entry) -> Step[D]:
    """The one takeover path starts here, whatever the entry."""
    floor = max(c.seen, c.polled.epoch if c.polled is not None else 0, c.previous)
    nxt = replace(c, phase=Phase.CLAIM, entry=entry, epoch=0, renewing=False)
    return nxt, (Claim(floor),)


def _not_now(rules: Rules, c: Control[D], now: float, reason: str) -> Step[D]:
    """Not controlling; try again later (a standby goes back to shadowing)."""
    phase = Phase.SHADOW if c.entry is Entry.STANDBY else Phase.WAIT
    delay = rules.probe_every if phase is Phase.SHADOW else rules.retry_every
    nxt = replace(c, phase=phase, epoch=0, due=now + delay, reason=reason, renewing=False)
    return nxt, (_report(nxt),)


def _fence(rules: Rules, c: Control[D], now: float, reason: str, *, release: bool) -> Step[D]:
    """Refused for good; etcd routers keep contending (the file lease keeps the peer rule)."""
    out: tuple[Effect[D], ...] = (Release(),) if release else ()
    c = replace(c, refusals=c.refusals + 1)
    if rules.contends and not rules.standby:
        nxt = replace(
            c, phase=Phase.WAIT, entry=Entry.CONTEND, epoch=0, due=now + rules.retry_every, reason=reason
        )
    else:
        nxt = replace(c, phase=Phase.FENCED, epoch=0, reason=reason, renewing=False)
    return nxt, (*out, _report(nxt))


def _lost_in_takeover(rules: Rules, c: Control[D], now: float, why: str) -> Step[D]:
    nxt, out = _not_now(rules, c, now, why)
    return nxt, (Release(), *out)


def step(rules: Rules, c: Control[D], ev: Event[D]) -> Step[D]:
    """One event → the next state and the effects the shell runs, in order."""
    if isinstance(ev, Started):
        if rules.standby:
            nxt = replace(c, phase=Phase.SHADOW, entry=Entry.STANDBY, due=ev.now, reason="shadowing")
            return nxt, (_report(nxt),)
        return begin(rules, c, Entry.START)
    if isinstance(ev, Tick):
        return _tick(rules, c, ev.now)
    if isinstance(ev, Enter):
        if c.phase in (Phase.CLAIM, Phase.READ, Phase.APPLY, Phase.ACTIVATE, Phase.CONTROL):
            return c, ()  # already on the path, or controlling
        return begin(rules, c, ev.entry)
    if isinstance(ev, Probed):
        return _probed(rules, c, ev)
    if isinstance(ev, ChangeRequested):
        if not c.controls(ev.now):
            return c, (Refuse((ev.token,), c.reason or "not controlling"),)
        return c, (Persist(c.epoch, (ev.token,)),)
    if isinstance(ev, Persisted):
        if not ev.tokens:
            return c, ()
        if ev.ok:
            return c, (Ack(ev.tokens),)
        return c, (Refuse(ev.tokens, "state write failed"),)
    if c.phase is Phase.CLAIM:
        return _claim_answer(rules, c, ev)
    if c.phase is Phase.READ and isinstance(ev, HandoffRead):
        return _read(rules, c, ev)
    if c.phase is Phase.APPLY and isinstance(ev, Applied):
        if not ev.ok:
            return _fence(rules, c, ev.now, ev.why or "takeover refused", release=True)
        if ev.now >= c.valid_until:
            return _lost_in_takeover(rules, c, ev.now, "lease expired while applying handoff")
        return replace(c, phase=Phase.ACTIVATE), (Activate(c.epoch),)
    if c.phase is Phase.ACTIVATE and isinstance(ev, Activated):
        if ev.now >= c.valid_until:  # a slow takeover, not a bad handoff: try again, never give up
            return _lost_in_takeover(rules, c, ev.now, ev.why or "lease expired during identity validation")
        if not ev.ok:
            return _fence(rules, c, ev.now, ev.why, release=True)
        nxt = replace(
            c, phase=Phase.CONTROL, due=ev.now + rules.renew_every, reason="", misses=0, waited=None
        )
        return nxt, (Persist(c.epoch), _report(nxt))
    if c.phase is Phase.CONTROL:
        return _controlling(rules, c, ev)
    return c, ()  # a late answer for a phase we left: ignored


def _tick(rules: Rules, c: Control[D], now: float) -> Step[D]:
    if now < c.due:
        return c, ()
    if c.phase is Phase.SHADOW:
        return replace(c, due=now + rules.probe_every), (Probe(),)
    if c.phase is Phase.WAIT:
        return begin(rules, c, c.entry)
    if c.phase is Phase.CONTROL and not c.renewing:
        return replace(c, renewing=True), (Renew(),)
    return c, ()


def _probed(rules: Rules, c: Control[D], ev: Probed[D]) -> Step[D]:
    if c.phase is not Phase.SHADOW:
        return c, ()
    if ev.doc is not None:
        polled = c.polled
        if polled is None or ev.doc.epoch >= polled.epoch:  # never an older epoch's snapshot
            polled = ev.doc
        return replace(c, polled=polled, misses=0, seen=max(c.seen, ev.doc.epoch), reason="shadowing"), ()
    misses = c.misses + 1
    if misses >= rules.takeover_after:
        return begin(rules, replace(c, misses=misses), Entry.STANDBY)
    return replace(c, misses=misses, reason=ev.reason or c.reason), ()


def _claim_answer(rules: Rules, c: Control[D], ev: Event[D]) -> Step[D]:
    if isinstance(ev, Claimed):
        nxt = replace(
            c,
            phase=Phase.READ,
            epoch=ev.epoch,
            record_previous=ev.previous_epoch,
            valid_until=ev.valid_until,
            seen=max(c.seen, ev.previous_epoch),
        )
        return nxt, (ReadHandoff(),)
    if isinstance(ev, StoreFailed):  # (the shell says why: "lease unavailable: …", damaged record)
        return _not_now(rules, c, ev.now, ev.reason)
    if not isinstance(ev, Held):
        return c, ()
    c = replace(c, seen=max(c.seen, ev.epoch))
    if c.entry is Entry.STANDBY:
        return _not_now(rules, c, ev.now, "shadowing")  # another holder's unexpired lease
    if c.entry is Entry.CONTEND or rules.contends:
        nxt = replace(
            c, phase=Phase.WAIT, entry=Entry.CONTEND, due=ev.now + rules.retry_every, reason=HELD_ELSEWHERE
        )
        return nxt, (_report(nxt),)
    if c.entry is Entry.START:  # file lease: a held record may be a process that is gone
        # renewed or taken since (``lease.renewed_since``): a new epoch or a later expiry; left
        # as it was or released (expiry moved back): its holder may be gone, keep waiting
        first = c.waited if c.waited is not None else (ev.epoch, ev.expires_at)
        if ev.epoch == first[0] and ev.expires_at <= first[1]:
            nxt = replace(
                c, phase=Phase.WAIT, waited=first, due=ev.now + rules.retry_every, reason=HELD_ELSEWHERE
            )
            return nxt, (_report(nxt),)
    return _fence(rules, c, ev.now, HELD_ELSEWHERE, release=False)  # renewed: its holder is alive


def _read(rules: Rules, c: Control[D], ev: HandoffRead[D]) -> Step[D]:
    if ev.now >= c.valid_until:
        why = "lease expired while reading the handoff" + (
            ": still unreadable" if ev.kind == "unreadable" else ""
        )
        return _lost_in_takeover(rules, c, ev.now, why)
    if ev.kind == "unreadable":  # never take control without the durable state: read again
        return replace(c, reason="handoff unreadable"), (ReadHandoff(),)
    durable = ev.doc if ev.kind == "ok" else None
    if c.entry is Entry.STANDBY:
        return _standby_read(rules, c, ev, durable)
    if c.entry is Entry.RECLAIM and ev.kind == "damaged":
        if c.record_previous <= c.previous:  # nobody else held the lease since: the copy was ours
            return replace(c, phase=Phase.ACTIVATE), (Activate(c.epoch),)
        why = (  # another holder's epoch since ours: the damaged copy may hold its acknowledged state
            f"lease claimed again, but the shared handoff is unusable after epoch {c.record_previous} "
            f"of another holder: {ev.reason or 'damaged'}"
        )
        return _fence(rules, c, ev.now, why, release=True)
    if ev.kind == "damaged":  # the damaged copy may have held the last epoch's acknowledged state
        if c.polled is None or c.polled.epoch < c.record_previous:
            why = "handoff damaged and no snapshot of the last epoch"
            if c.entry is Entry.CONTEND:
                why = f"lease taken over, but the stored handoff is unusable: {ev.reason or 'damaged'}"
            return _fence(rules, c, ev.now, why, release=True)
    chosen = durable
    if chosen is None or (c.previous and chosen.epoch <= c.previous):  # nothing, or our own
        return replace(c, phase=Phase.ACTIVATE), (Activate(c.epoch),)
    if chosen.epoch >= c.epoch:
        why = f"handoff epoch {chosen.epoch} cannot precede claimed epoch {c.epoch}"
        return _fence(rules, c, ev.now, why, release=True)
    nxt = replace(c, phase=Phase.APPLY, seen=max(c.seen, chosen.epoch))
    return nxt, (Apply(chosen, c.entry),)


def _standby_read(rules: Rules, c: Control[D], ev: HandoffRead[D], durable: D | None) -> Step[D]:
    """A standby always takes over *with* a handoff: the newest of its poll (only while fresh,
    unless a durable copy is there) and the durable copy; none at all: back to shadowing."""
    polled = c.polled if ev.poll_fresh or durable is not None else None
    chosen = freshest(polled, durable)
    if chosen is None:  # the poll aged out meanwhile and there is no durable copy
        return _lost_in_takeover(rules, c, ev.now, NO_FRESH_HANDOFF)
    if chosen.epoch >= c.epoch:
        why = f"handoff epoch {chosen.epoch} cannot precede claimed epoch {c.epoch}"
        return _fence(rules, c, ev.now, why, release=True)
    if ev.kind == "damaged" and chosen.epoch < c.record_previous:  # it may have held that epoch's acks
        why = (
            f"{ev.reason or 'handoff damaged'}; the newest valid handoff (epoch {chosen.epoch}) is older "
            f"than the lease's last epoch {c.record_previous}"
        )
        return _fence(rules, c, ev.now, why, release=True)
    nxt = replace(c, phase=Phase.APPLY, seen=max(c.seen, chosen.epoch))
    return nxt, (Apply(chosen, c.entry),)


def _controlling(rules: Rules, c: Control[D], ev: Event[D]) -> Step[D]:
    if isinstance(ev, Renewed):
        return replace(c, renewing=False, valid_until=ev.valid_until, due=ev.now + rules.renew_every), ()
    if isinstance(ev, RenewLost):
        return _fence(rules, replace(c, previous=c.epoch), ev.now, RENEWAL_FAILED, release=False)
    if isinstance(ev, StoreFailed):
        if ev.now < c.valid_until:  # retried within validity
            return replace(c, renewing=False, due=ev.now + rules.retry_every, reason=ev.reason), ()
        lost = replace(c, previous=c.epoch, reason=f"lease renewal failing: {ev.reason}")
        nxt, out = begin(rules, lost, Entry.RECLAIM)
        return nxt, (_report(nxt), *out)
    return c, ()
