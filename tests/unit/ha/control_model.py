"""A simulated control store and 2–3 routers running the real pure machine (``router.ha.machine``),
explored exhaustively (breadth first, states deduplicated) to a bounded depth.

The store is an etcd-like lease: a holder with a TTL, an epoch counter that every claim raises
above the claimer's floor, and a handoff document whose writes are fenced by the holder (a write
commits only while the writer still holds the unexpired lease at the epoch it names). One
*step* is one of: the clock advancing one unit; one router taking its next step (running its next
effect against the store and feeding the answer back, or a clock tick / start); a client sending a
lifecycle change to a router that controls; or a fault while budget remains — kill (a new process
starts in its place), freeze / thaw (SIGSTOP: no steps while time passes), partition / heal (store
unreachable for that router), a store error on one operation, a torn write (nothing committed,
error) and an ambiguous write (committed, but the writer sees an error).

Invariants, checked in every state reached: at most one router controls at a time, and each epoch
is controlled by at most one process; a router that starts controlling does so with an epoch above
every epoch controlled before (epochs never go backwards, nor does the stored handoff's); every
acknowledged change is in the state of every router that starts controlling afterwards, and of the
controller now. Liveness: from every state in which no fault is active (nobody frozen or
partitioned), a fair fault-free schedule (round robin, one clock unit per round) reaches a state in
which some router controls within ``LIVE_BOUND`` clock units.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from router.ha import machine as m

TTL = 3
MARGIN = 1  # local validity ends before the store's TTL (the lease's safety margin)
LIVE_BOUND = 12


@dataclass(frozen=True, order=True)
class Doc:
    epoch: int
    at: float
    changes: frozenset[int] = frozenset()


Ctl = m.Control[Doc]
StepFn = Callable[[m.Rules, Ctl, "m.Event[Doc]"], "m.Step[Doc]"]


class Router(NamedTuple):
    rules: m.Rules
    inc: int  # process incarnation: its holder identity
    c: Ctl = m.Control()
    queue: tuple[m.Effect[Doc], ...] = ()
    mem: frozenset[int] = frozenset()  # the lifecycle state in memory (changes applied)
    frozen: bool = False
    parted: bool = False


class Store(NamedTuple):
    holder: int | None = None
    epoch: int = 0
    expires: int = 0
    doc: Doc | None = None


class Budget(NamedTuple):
    kills: int = 1
    freezes: int = 1
    partitions: int = 1
    errors: int = 1
    torn: int = 1
    changes: int = 2


class World(NamedTuple):
    now: int
    store: Store
    routers: tuple[Router, ...]
    budget: Budget
    next_inc: int
    next_token: int = 1
    acked: frozenset[int] = frozenset()
    controllers: frozenset[tuple[int, int]] = frozenset()  # (epoch, incarnation) that controlled
    max_controlled: int = 0


class Violation(AssertionError):
    def __init__(self, what: str, trace: list[str]) -> None:
        super().__init__(what + "\n  " + "\n  ".join(trace))
        self.what = what
        self.trace = trace


@dataclass
class Result:
    states: int
    depth: int
    violation: Violation | None = None


def initial(rules: tuple[m.Rules, ...], budget: Budget, step: StepFn = m.step, warm: bool = False) -> World:
    """Every router unstarted, or (``warm``) the steady state: router 0 controls epoch 1 with its
    handoff written, the others started (shadowing or contending)."""
    routers = tuple(Router(r, inc=i + 1) for i, r in enumerate(rules))
    w = World(now=0, store=Store(), routers=routers, budget=budget, next_inc=len(rules) + 1)
    if not warm:
        return w
    for i in range(len(rules)):
        for _ in range(32):
            nxt = _act(w, i, step)
            if nxt is None:
                break
            w = nxt
    assert w.routers[0].c.controls(w.now) and w.store.doc is not None, _describe(w)
    return w


# -- running one router's machine -----------------------------------------------------------------
def _feed(w: World, i: int, ev: m.Event[Doc], step: StepFn) -> World:
    r = w.routers[i]
    before = r.c
    c, effects = step(r.rules, r.c, ev)
    queue = list(r.queue)
    acked, controllers, max_controlled = w.acked, w.controllers, w.max_controlled
    for eff in effects:
        if isinstance(eff, m.Ack):
            acked = acked | frozenset(eff.tokens)
        elif isinstance(eff, (m.Refuse, m.Report)):
            continue
        else:
            queue.append(eff)
    if c.phase is m.Phase.CONTROL and before.phase is not m.Phase.CONTROL:
        lost = acked - r.mem
        if lost:
            raise _Broken(f"router {i} controls epoch {c.epoch} without acknowledged changes {sorted(lost)}")
        for epoch, inc in controllers:
            if epoch == c.epoch and inc != r.inc:
                raise _Broken(f"epoch {c.epoch} controlled by two processes ({inc} and {r.inc})")
        if c.epoch <= max_controlled:
            raise _Broken(
                f"router {i} controls epoch {c.epoch}, not above {max_controlled} controlled before"
            )
        controllers = controllers | {(c.epoch, r.inc)}
        max_controlled = c.epoch
    routers = _set(w.routers, i, r._replace(c=c, queue=tuple(queue)))
    return w._replace(routers=routers, acked=acked, controllers=controllers, max_controlled=max_controlled)


class _Broken(Exception):
    pass


def _set(routers: tuple[Router, ...], i: int, r: Router) -> tuple[Router, ...]:
    return (*routers[:i], r, *routers[i + 1 :])


def _snapshot(w: World, i: int) -> Doc | None:
    """A standby's probe: the live snapshot of the router holding the store's lease, if it answers."""
    s = w.store
    for j, p in enumerate(w.routers):
        if j == i or p.frozen or not p.c.controls(w.now):
            continue
        if s.holder == p.inc and s.epoch == p.c.epoch and w.now < s.expires:
            return Doc(p.c.epoch, w.now, p.mem)
    return None


def _run_effect(w: World, i: int, faulty: bool) -> tuple[World, m.Event[Doc]]:
    """Run router i's next effect against the store; ``faulty``: this operation fails."""
    r = w.routers[i]
    eff, rest = r.queue[0], r.queue[1:]
    w = w._replace(routers=_set(w.routers, i, r._replace(queue=rest)))
    now, s = w.now, w.store
    down = r.parted or faulty
    if isinstance(eff, m.Probe):
        return w, m.Probed(now, None if r.parted else _snapshot(w, i), "primary not answering")
    if isinstance(eff, m.Claim):
        if down:
            return w, m.StoreFailed(now, "store unreachable")
        if s.holder is not None and s.holder != r.inc and now < s.expires:
            return w, m.Held(now, s.epoch, s.expires)
        epoch = max(s.epoch, eff.floor) + 1
        w = w._replace(store=s._replace(holder=r.inc, epoch=epoch, expires=now + TTL))
        return w, m.Claimed(now, epoch, s.epoch, now + TTL - MARGIN)
    if isinstance(eff, m.ReadHandoff):
        if down:
            return w, m.HandoffRead(now, "unreadable")
        return w, m.HandoffRead(now, "ok" if s.doc is not None else "missing", s.doc)
    if isinstance(eff, m.Apply):
        w = w._replace(routers=_set(w.routers, i, w.routers[i]._replace(mem=eff.doc.changes)))
        return w, m.Applied(now, True)
    if isinstance(eff, m.Activate):
        return w, m.Activated(now, True)
    if isinstance(eff, m.Renew):
        if down:
            return w, m.StoreFailed(now, "store unreachable")
        if s.holder == r.inc and s.epoch == r.c.epoch and now < s.expires:
            w = w._replace(store=s._replace(expires=now + TTL))
            return w, m.Renewed(now, now + TTL - MARGIN)
        return w, m.RenewLost(now)
    if isinstance(eff, m.Release):
        if not down and s.holder == r.inc:
            w = w._replace(store=s._replace(holder=None))
        return w, m.Tick(now)
    assert isinstance(eff, m.Persist), eff
    fenced_ok = s.holder == r.inc and s.epoch == eff.epoch and now < s.expires
    if r.parted or not fenced_ok:
        return w, m.Persisted(now, False, eff.tokens)
    if faulty:
        return w, m.Persisted(now, False, eff.tokens)  # a store error or a torn write: nothing committed
    w = w._replace(store=_write(s, Doc(eff.epoch, now, w.routers[i].mem)))
    return w, m.Persisted(now, True, eff.tokens)


def _write(s: Store, doc: Doc) -> Store:
    if s.doc is not None and doc.epoch < s.doc.epoch:
        raise _Broken(f"stored handoff epoch went back from {s.doc.epoch} to {doc.epoch}")
    return s._replace(doc=doc)


def _ambiguous(w: World, i: int) -> tuple[World, m.Event[Doc]]:
    """A write that commits while the writer sees an error (timeout after the txn applied)."""
    r = w.routers[i]
    eff = r.queue[0]
    assert isinstance(eff, m.Persist)
    w2, ev = _run_effect(w, i, faulty=False)
    return w2, m.Persisted(w.now, False, eff.tokens) if isinstance(ev, m.Persisted) else ev


def _act(w: World, i: int, step: StepFn, mode: str = "") -> World | None:
    """Router i's next step (None: nothing to do)."""
    r = w.routers[i]
    if r.queue:
        if mode == "ambiguous":
            w, ev = _ambiguous(w, i)
        else:
            w, ev = _run_effect(w, i, faulty=bool(mode))
        if isinstance(ev, m.Tick) and ev.now == w.now and isinstance(r.queue[0], m.Release):
            return w
        return _feed(w, i, ev, step)
    ev0: m.Event[Doc] = m.Started(w.now) if r.c.phase is m.Phase.IDLE else m.Tick(w.now)
    nxt = _feed(w, i, ev0, step)
    return None if nxt == w else nxt


def successors(w: World, step: StepFn, max_time: int) -> Iterator[tuple[str, World]]:
    """Time passes only while every router that is not frozen is idle (maximal progress): a late
    step is a freeze, and spends the freeze budget."""
    b = w.budget
    acts = [None if r.frozen else _act(w, i, step) for i, r in enumerate(w.routers)]
    if w.now < max_time and all(a is None for a in acts):
        yield "tick", w._replace(now=w.now + 1)
    for i, r in enumerate(w.routers):
        if not r.frozen:
            nxt = acts[i]
            if nxt is not None:
                yield f"r{i} {type(r.queue[0]).__name__ if r.queue else 'tick'}", nxt
            if (
                r.queue
                and not r.parted
                and isinstance(r.queue[0], (m.Claim, m.ReadHandoff, m.Renew))
                and b.errors
            ):
                nb = w._replace(budget=b._replace(errors=b.errors - 1))
                yield f"r{i} {type(r.queue[0]).__name__} store error", _act(nb, i, step, "error") or nb
            if r.queue and isinstance(r.queue[0], m.Persist) and b.torn:
                nb = w._replace(budget=b._replace(torn=b.torn - 1))
                yield f"r{i} Persist torn", _act(nb, i, step, "torn") or nb
                yield f"r{i} Persist ambiguous", _act(nb, i, step, "ambiguous") or nb
            if r.c.controls(w.now) and b.changes:
                tok = w.next_token
                nr = r._replace(mem=r.mem | {tok})
                nw = w._replace(routers=_set(w.routers, i, nr), next_token=tok + 1)
                nw = nw._replace(budget=b._replace(changes=b.changes - 1))
                yield f"client change {tok} to r{i}", _feed(nw, i, m.ChangeRequested(w.now, tok), step)
        if b.kills:
            fresh = Router(r.rules, inc=w.next_inc)
            nw = w._replace(routers=_set(w.routers, i, fresh), next_inc=w.next_inc + 1)
            yield f"kill r{i}", nw._replace(budget=b._replace(kills=b.kills - 1))
        if r.frozen:
            yield f"thaw r{i}", w._replace(routers=_set(w.routers, i, r._replace(frozen=False)))
        elif b.freezes:
            nw = w._replace(routers=_set(w.routers, i, r._replace(frozen=True)))
            yield f"freeze r{i}", nw._replace(budget=b._replace(freezes=b.freezes - 1))
        if r.parted:
            yield f"heal r{i}", w._replace(routers=_set(w.routers, i, r._replace(parted=False)))
        elif b.partitions:
            nw = w._replace(routers=_set(w.routers, i, r._replace(parted=True)))
            yield f"partition r{i}", nw._replace(budget=b._replace(partitions=b.partitions - 1))


def _check_now(w: World) -> str:
    controlling = [i for i, r in enumerate(w.routers) if r.c.controls(w.now)]
    if len(controlling) > 1:
        return f"routers {controlling} control at once (t={w.now})"
    for i in controlling:
        lost = w.acked - w.routers[i].mem
        if lost:
            return f"controller r{i} lacks acknowledged changes {sorted(lost)}"
    return ""


def _healed(w: World) -> bool:
    return not any(r.frozen or r.parted for r in w.routers)


def live(w: World, step: StepFn, cache: dict[World, int]) -> bool:
    """Fair fault-free schedule: every router runs until idle, then the clock advances one unit.
    ``cache``: worlds on such a run → the clock units they needed (runs share their tails)."""
    path: list[tuple[World, int]] = []
    for units in range(LIVE_BOUND + 1):
        known = cache.get(w)
        if known is not None:
            if units + known > LIVE_BOUND:
                return False
            for seen, at in path:
                cache[seen] = known + units - at
            return True
        path.append((w, units))
        for i in range(len(w.routers)):
            for _ in range(16):
                if any(r.c.controls(w.now) for r in w.routers):
                    for seen, at in path:
                        cache[seen] = units - at
                    return True
                nxt = _act(w, i, step)
                if nxt is None:
                    break
                w = nxt
        if any(r.c.controls(w.now) for r in w.routers):
            for seen, at in path:
                cache[seen] = units - at
            return True
        w = w._replace(now=w.now + 1)
    return False


def explore(
    rules: tuple[m.Rules, ...],
    budget: Budget,
    depth: int,
    max_time: int,
    step: StepFn = m.step,
    warm: bool = False,
    start: World | None = None,
) -> Result:
    """Every interleaving to ``depth`` steps (states deduplicated) from ``start`` (default:
    ``initial``); the first violation found."""
    if start is None:
        start = initial(rules, budget, step, warm)
    parents: dict[World, tuple[World | None, str]] = {start: (None, "start")}
    frontier: deque[tuple[World, int]] = deque([(start, 0)])
    reached = 0
    live_cache: dict[World, int] = {}

    def trace(w: World | None) -> list[str]:
        out: list[str] = []
        while w is not None:
            prev, label = parents[w]
            out.append(f"{label} (t={w.now} {_describe(w)})")
            w = prev
        return out[::-1]

    while frontier:
        w, d = frontier.popleft()
        reached = max(reached, d)
        try:
            if _healed(w) and not live(w, step, live_cache):
                return Result(
                    len(parents), reached, Violation("no router controls after faults healed", trace(w))
                )
        except _Broken as exc:
            return Result(len(parents), reached, Violation(f"{exc} (on the fault-free run)", trace(w)))
        if d == depth:
            continue
        try:
            succ = list(successors(w, step, max_time))
        except _Broken as exc:
            return Result(len(parents), reached, Violation(str(exc), trace(w)))
        for label, nxt in succ:
            if nxt in parents:
                continue
            parents[nxt] = (w, label)
            bad = _check_now(nxt)
            if bad:
                return Result(len(parents), d + 1, Violation(bad, trace(nxt)))
            frontier.append((nxt, d + 1))
    return Result(len(parents), reached)


def _describe(w: World) -> str:
    parts = [f"store h={w.store.holder} e={w.store.epoch} x={w.store.expires}"]
    for i, r in enumerate(w.routers):
        flags = ("F" if r.frozen else "") + ("P" if r.parted else "")
        parts.append(f"r{i}#{r.inc} {r.c.phase.value} e={r.c.epoch}{flags}")
    return ", ".join(parts)
