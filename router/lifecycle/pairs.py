"""Fabric pair selection for readmission (spec §6.5). Pure.

A pair ``(src, dst)`` means: prefill on ``src`` (producer), decode on ``dst`` (consumer) with the
descriptor ``src`` produced. Pinned engines only take their own role's leg.
"""

from __future__ import annotations

from collections.abc import Sequence

from router.scheduler import EngineRuntime

Pair = tuple[str, str]


class PairError(ValueError):
    """No usable fabric pair; the message is the readmission failure."""


def can_produce(e: EngineRuntime) -> bool:
    return e.can_serve("prefill")


def can_consume(e: EngineRuntime) -> bool:
    return e.can_serve("decode")


def validation_pairs(engines: Sequence[EngineRuntime]) -> list[Pair]:
    """Wave pairs: each producer feeds the next consumer in rotation; uncovered consumers get one."""
    ordered = sorted(engines, key=lambda e: e.iid)
    if len(ordered) < 2:
        return []
    n = len(ordered)
    pairs: list[Pair] = []
    for i, producer in enumerate(ordered):
        if not can_produce(producer):
            continue
        for step in range(1, n):
            consumer = ordered[(i + step) % n]
            if can_consume(consumer):
                pairs.append((producer.iid, consumer.iid))
                break
    covered = {dst for _, dst in pairs}
    for consumer in ordered:
        if can_consume(consumer) and consumer.iid not in covered:
            feeder = next((p for p in ordered if p.iid != consumer.iid and can_produce(p)), None)
            if feeder is not None:
                pairs.append((feeder.iid, consumer.iid))
    if not pairs:
        raise PairError("fabric validation requires a peer in the opposite role")
    return pairs


def recovery_pairs(target: EngineRuntime, peers: Sequence[EngineRuntime]) -> list[Pair]:
    """Single target: produce to the first consumer-capable peer, consume from the first producer."""
    live = sorted((p for p in peers if p.iid != target.iid), key=lambda e: e.iid)
    if not live:
        raise PairError("fabric validation requires an eligible peer")
    pairs: list[Pair] = []
    if can_produce(target):
        consumer = next((p for p in live if can_consume(p)), None)
        if consumer is None:
            if not can_consume(target):
                raise PairError(f"{target.iid} has no eligible fabric consumer peer")
        else:
            pairs.append((target.iid, consumer.iid))
    if can_consume(target):
        producer = next((p for p in live if can_produce(p)), None)
        if producer is None:
            if not pairs:
                raise PairError(f"{target.iid} has no eligible fabric producer peer")
        else:
            pairs.append((producer.iid, target.iid))
    if not pairs:
        raise PairError("fabric validation requires a peer in the opposite role")
    return pairs
