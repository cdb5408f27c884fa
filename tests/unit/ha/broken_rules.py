"""Deliberately broken variants of the control machine: the interleaving check must find each."""

from __future__ import annotations

from dataclasses import replace

from router.ha import machine as m
from tests.unit.ha.control_model import MARGIN, TTL, Doc

Ctl = m.Control[Doc]


def takes_over_without_fencing(rules: m.Rules, c: Ctl, ev: m.Event[Doc]) -> m.Step[Doc]:
    """A live holder's lease is taken over as if it had expired (the holder is not checked)."""
    if c.phase is m.Phase.CLAIM and isinstance(ev, m.Held):
        ev = m.Claimed(ev.now, ev.epoch + 1, ev.epoch, ev.now + TTL - MARGIN)
    return m.step(rules, c, ev)


def acks_before_persisting(rules: m.Rules, c: Ctl, ev: m.Event[Doc]) -> m.Step[Doc]:
    """The change is answered before the handoff carrying it is written."""
    if isinstance(ev, m.ChangeRequested) and c.controls(ev.now):
        return c, (m.Ack((ev.token,)), m.Persist(c.epoch))
    if isinstance(ev, m.Persisted):
        return c, ()
    return m.step(rules, c, ev)


def gives_up_a_slow_takeover(rules: m.Rules, c: Ctl, ev: m.Event[Doc]) -> m.Step[Doc]:
    """A takeover whose lease ran out mid-way is refused for good instead of retried."""
    nxt, out = m.step(rules, c, ev)
    if c.phase in (m.Phase.READ, m.Phase.APPLY, m.Phase.ACTIVATE) and any(
        isinstance(e, m.Release) for e in out
    ):
        if nxt.phase in (m.Phase.WAIT, m.Phase.SHADOW) and nxt.reason.startswith("lease expired"):
            return replace(nxt, phase=m.Phase.FENCED), out
    return nxt, out


def reclaims_over_an_unreadable_handoff(rules: m.Rules, c: Ctl, ev: m.Event[Doc]) -> m.Step[Doc]:
    """The keeper's re-claim rule today (``HAService._claimed``): a shared handoff it cannot read
    counts as "nothing newer", and the router resumes with its own state."""
    if c.phase is m.Phase.READ and isinstance(ev, m.HandoffRead) and ev.kind == "unreadable":
        if c.entry is m.Entry.RECLAIM and ev.now < c.valid_until:
            return replace(c, phase=m.Phase.ACTIVATE), (m.Activate(c.epoch),)
    return m.step(rules, c, ev)
