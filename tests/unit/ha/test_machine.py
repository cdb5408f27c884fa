"""The control machine's rules, one event at a time (no store, no clock)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from router.ha import machine as m


@dataclass(frozen=True)
class Doc:
    epoch: int
    at: float


RULES = m.Rules(renew_every=1, retry_every=1)
ETCD = m.Rules(contends=True, renew_every=1, retry_every=1)
STANDBY = m.Rules(standby=True, takeover_after=2)


def feed(rules: m.Rules, c: m.Control[Doc], *events: m.Event[Doc]) -> tuple[m.Control[Doc], list[object]]:
    effects: list[object] = []
    for ev in events:
        c, out = m.step(rules, c, ev)
        effects.extend(out)
    return c, effects


def kinds(effects: list[object]) -> list[str]:
    return [type(e).__name__ for e in effects if not isinstance(e, m.Report)]


def controlling(rules: m.Rules = RULES, epoch: int = 1) -> m.Control[Doc]:
    c, _ = feed(
        rules,
        m.Control[Doc](),
        m.Started(0),
        m.Claimed(0, epoch, epoch - 1, 2),
        m.HandoffRead[Doc](0, "missing"),
        m.Activated(0, True),
    )
    assert c.controls(0)
    return c


@pytest.mark.parametrize("entry", list(m.Entry))
def test_every_entry_takes_the_same_path_claim_read_apply_activate(entry: m.Entry) -> None:
    c, out = m.begin(RULES, m.Control[Doc](seen=4), entry)
    assert out == (m.Claim(4),)
    c, effects = feed(RULES, c, m.Claimed(0, 6, 5, 2))
    assert kinds(effects) == ["ReadHandoff"]
    c, effects = feed(RULES, c, m.HandoffRead(0, "ok", Doc(5, 0.0)), m.Applied(0, True), m.Activated(0, True))
    assert kinds(effects) == ["Apply", "Activate", "Persist"]
    assert c.controls(0) and c.epoch == 6


def test_a_handoff_from_the_claimed_epoch_or_later_is_refused_for_good() -> None:
    c, effects = feed(
        RULES, m.Control[Doc](), m.Started(0), m.Claimed(0, 3, 2, 2), m.HandoffRead(0, "ok", Doc(3, 0.0))
    )
    assert c.phase is m.Phase.FENCED and "cannot precede claimed epoch 3" in c.reason
    assert kinds(effects) == ["Claim", "ReadHandoff", "Release"]


def test_an_unreadable_handoff_after_a_reclaim_is_read_again_not_skipped() -> None:
    """The keeper used to resume with its own state when the store could not be read after a
    re-claim; another controller may have acknowledged changes meanwhile."""
    c = controlling()
    c, effects = feed(RULES, c, m.Tick(1), m.StoreFailed(2, "timeout"))
    assert c.entry is m.Entry.RECLAIM and kinds(effects) == ["Renew", "Claim"]
    c, effects = feed(RULES, c, m.Claimed(2, 3, 2, 4), m.HandoffRead[Doc](2, "unreadable"))
    assert not c.controls(2) and kinds(effects) == ["ReadHandoff", "ReadHandoff"]
    c, effects = feed(RULES, c, m.HandoffRead(3, "ok", Doc(2, 1.0)), m.Applied(3, True), m.Activated(3, True))
    assert c.controls(3) and kinds(effects) == ["Apply", "Activate", "Persist"]


def test_a_reclaim_keeps_its_own_state_when_nobody_wrote_a_newer_epoch() -> None:
    c = controlling()
    c, _ = feed(RULES, c, m.Tick(1), m.StoreFailed(2, "timeout"), m.Claimed(2, 2, 1, 4))
    c, effects = feed(RULES, c, m.HandoffRead(2, "ok", Doc(1, 0.5)))
    assert kinds(effects) == ["Activate"]


def test_a_store_error_is_retried_within_validity() -> None:
    c, effects = feed(RULES, controlling(), m.Tick(1), m.StoreFailed(1, "EINTR"), m.Tick(1.5), m.Tick(2.0))
    assert c.phase is m.Phase.CONTROL and kinds(effects) == ["Renew", "Renew"]  # retried at 2.0


def test_a_real_loss_fences_the_file_lease_and_etcd_contends() -> None:
    c, _ = feed(RULES, controlling(), m.Tick(1), m.RenewLost(1))
    assert c.phase is m.Phase.FENCED and c.reason == m.RENEWAL_FAILED
    c, effects = feed(ETCD, controlling(ETCD), m.Tick(1), m.RenewLost(1), m.Tick(2))
    assert c.entry is m.Entry.CONTEND and kinds(effects) == ["Renew", "Claim"]


def test_a_lease_found_held_at_start_is_waited_out_and_fences_once_renewed() -> None:
    c, _ = feed(RULES, m.Control[Doc](), m.Started(0), m.Held(0, 1, 3.0))
    assert c.phase is m.Phase.WAIT and c.reason == m.HELD_ELSEWHERE
    waiting, effects = feed(RULES, c, m.Tick(1), m.Held(1, 1, 3.0))
    assert waiting.phase is m.Phase.WAIT and kinds(effects) == ["Claim"]
    fenced, _ = feed(RULES, waiting, m.Tick(2), m.Held(2, 1, 4.0))  # renewed: its holder is alive
    assert fenced.phase is m.Phase.FENCED


def test_a_lease_found_held_at_start_and_released_is_still_waited_out_then_claimed() -> None:
    c, _ = feed(RULES, m.Control[Doc](), m.Started(0), m.Held(0, 1, 3.0))
    waiting, _ = feed(RULES, c, m.Tick(1), m.Held(1, 1, 1.0))  # released: expiry moved back
    assert waiting.phase is m.Phase.WAIT and waiting.waited == (1, 3.0)
    _, effects = feed(RULES, waiting, m.Tick(2), m.Claimed(2, 2, 1, 9.0))
    assert kinds(effects) == ["Claim", "ReadHandoff"]


def test_a_standby_takes_over_after_misses_and_shadows_on_when_the_lease_is_held() -> None:
    c, _ = feed(STANDBY, m.Control[Doc](), m.Started(0), m.Probed(0, Doc(1, 0.0)))
    c, effects = feed(STANDBY, c, m.Probed[Doc](1, None), m.Probed[Doc](2, None))
    assert kinds(effects) == ["Claim"] and effects[-1] == m.Claim(1)
    c, _ = feed(STANDBY, c, m.Held(2, 1, 5.0))
    assert c.phase is m.Phase.SHADOW


def test_a_standby_applies_its_snapshot_when_it_is_newer_than_the_durable_copy() -> None:
    c, _ = feed(STANDBY, m.Control[Doc](), m.Started(0), m.Probed(0, Doc(1, 5.0)))
    c, _ = feed(STANDBY, c, m.Probed[Doc](1, None), m.Probed[Doc](2, None), m.Claimed(2, 2, 1, 9))
    _, effects = feed(STANDBY, c, m.HandoffRead(2, "ok", Doc(1, 4.0)))
    assert effects[-1] == m.Apply(Doc(1, 5.0), m.Entry.STANDBY)


def test_a_change_is_acknowledged_only_after_its_persist_succeeded() -> None:
    c = controlling()
    _, effects = feed(RULES, c, m.ChangeRequested(0.5, 7))
    assert effects == [m.Persist(1, (7,))]
    assert feed(RULES, c, m.Persisted(0.6, True, (7,)))[1] == [m.Ack((7,))]
    assert kinds(feed(RULES, c, m.Persisted(0.6, False, (7,)))[1]) == ["Refuse"]
    assert kinds(feed(RULES, c, m.ChangeRequested(3.0, 8))[1]) == ["Refuse"]  # lease ran out locally


def test_a_takeover_whose_lease_ran_out_is_retried_not_refused() -> None:
    c, _ = feed(STANDBY, m.Control[Doc](), m.Started(0), m.Probed[Doc](0, None), m.Probed[Doc](1, None))
    c, effects = feed(
        STANDBY, c, m.Claimed(1, 1, 0, 3), m.HandoffRead[Doc](1, "missing"), m.Activated(4, True)
    )
    assert c.phase is m.Phase.SHADOW and kinds(effects)[-1] == "Release"
