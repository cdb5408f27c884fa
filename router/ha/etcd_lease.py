"""The etcd lease backend: holder key on an etcd lease, epoch counter, fenced handoff writes.

Keys under the prefix (default ``/narwhal/<model>/``; the layout and the holder document are
``router/ha/etcd_keys.py``'s; see docs/ha.md):

- ``<prefix>holder`` — ``narwhal.etcd-holder`` v1 (holder token, epoch, router id), attached to an
  etcd lease with the configured TTL: it vanishes when the holder stops renewing.
- ``<prefix>epoch`` — the last epoch ever claimed (decimal). A claim is one transaction: *holder
  key absent* and *epoch and handoff unchanged since read* → put ``epoch = N + 1`` and the holder
  key. Epochs are monotonic across holders and never reused.
- ``<prefix>handoff`` — the holder's ``narwhal.handoff`` v1. Every write is a transaction guarded
  by the holder key's create revision (our incarnation of the key) and the handoff's own last
  mod revision (nobody else wrote it since): a router that lost the lease, or was frozen past its
  TTL, cannot overwrite its successor's document.

Local validity is a monotonic deadline, ``ttl − safety margin`` after the *start* of the last
successful keep-alive, so a holder that cannot reach etcd stops controlling before etcd can give
the lease to anyone else. A failed fenced write marks the lease *unverified* (``valid()`` False)
until the next renewal re-reads the holder key.

Anything under the prefix that is not what we wrote (a foreign or torn document) is refused with
a reason (``EtcdKeyRefused``) and never overwritten.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from dataclasses import dataclass

from router.clock import Clock, SystemClock
from router.ha.etcd_client import (
    EtcdClient,
    EtcdError,
    KeyValue,
    cmp_create,
    cmp_mod,
    op_put,
    op_range,
)

# the key layout and the documents (``EtcdKeyRefused``, ``check_prefix``, ``default_prefix``: re-exported)
from router.ha.etcd_keys import HOLDER_SCHEMA as HOLDER_SCHEMA
from router.ha.etcd_keys import EtcdKeyRefused as EtcdKeyRefused
from router.ha.etcd_keys import EtcdKeys, HolderDoc, parse_epoch, parse_handoff, parse_holder
from router.ha.etcd_keys import check_prefix as check_prefix
from router.ha.etcd_keys import default_prefix as default_prefix
from router.ha.handoff import Handoff, validate
from router.ha.lease import LeaseError, LeaseRecord, new_holder

log = logging.getLogger("narwhal.ha.etcd")


class FencedWriteFailed(LeaseError):
    """The handoff transaction did not commit (lease lost, key changed, or etcd unreachable)."""


@dataclass(frozen=True, slots=True)
class EtcdLeaseSettings:
    router_id: str
    prefix: str
    model: str
    ttl_s: float = 5.0
    renew_interval_s: float = 1.0
    safety_margin_s: float = 1.0


class EtcdLease:
    """One process's holder token on etcd (``router.ha.lease_backend.ControlLease``)."""

    # ControlLease.contends: after losing control (an etcd outage, a live holder) claim again once
    # the holder key is vacant, instead of staying fenced for good
    contends = True

    def __init__(
        self,
        settings: EtcdLeaseSettings,
        client: EtcdClient,
        clock: Clock | None = None,
        holder: str | None = None,
    ) -> None:
        self.settings = settings
        self.client = client
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.holder = holder if holder is not None else new_holder(settings.router_id)
        self.keys = EtcdKeys(check_prefix(settings.prefix))
        self.holder_key = self.keys.holder
        self.epoch_key = self.keys.epoch
        self.handoff_key = self.keys.handoff
        self.owned = False
        self.verified = False  # False after a fenced write failed, until a renewal re-reads the key
        self.epoch = 0
        self.previous_epoch = 0  # the counter before our claim
        self.deadline = 0.0  # monotonic
        self.lease_id = 0
        self.holder_rev = 0  # create revision of our holder key
        self.handoff_rev = 0  # mod revision of the handoff as we last saw or wrote it
        self.last_error = ""
        self.problem = ""  # (the keeper's view) etcd keys are never "damaged and waited out"
        self.recovered = ""

    def describe(self) -> str:
        return f"etcd {','.join(self.client.endpoints)} {self.settings.prefix}"

    def valid(self) -> bool:
        return self.owned and self.verified and self.clock.monotonic() < self.deadline

    def remaining(self) -> float:
        return max(0.0, self.deadline - self.clock.monotonic()) if self.owned else 0.0

    def _local_deadline(self, mono_before: float) -> float:
        return mono_before + self.settings.ttl_s - self.settings.safety_margin_s

    def _unavailable(self, what: str, exc: EtcdError) -> LeaseError:
        self.last_error = f"{what}: {exc}"
        return LeaseError(self.last_error)

    async def _read_keys(self) -> tuple[KeyValue | None, KeyValue | None, KeyValue | None]:
        """holder, epoch and handoff at one revision."""
        res = await self.client.txn(
            [], [op_range(self.holder_key), op_range(self.epoch_key), op_range(self.handoff_key)]
        )
        h, e, d = (kvs[0] if kvs else None for kvs in res.ranges())
        return h, e, d

    # -- claim / renew / release ---------------------------------------------------------------
    async def claim(self, floor: int = 0, attempts: int = 3) -> bool:
        """True when we now hold the lease; False while another holder's key stands.
        ``LeaseError`` when etcd is unreachable; ``EtcdKeyRefused`` for foreign keys."""
        for _ in range(attempts):
            mono = self.clock.monotonic()
            try:
                holder_kv, epoch_kv, handoff_kv = await self._read_keys()
            except EtcdError as exc:
                self.owned = False
                raise self._unavailable("cannot claim lease", exc) from None
            counter = parse_epoch(epoch_kv)
            epoch = max(counter, floor)  # never below an epoch seen in a handoff document
            if handoff_kv is not None:
                parse_handoff(handoff_kv, self.settings.model)  # refuse a foreign/torn one up front
            if holder_kv is not None:
                current = parse_holder(holder_kv)
                if (
                    self.owned
                    and current.holder == self.holder
                    and holder_kv.create_revision == self.holder_rev
                ):
                    return await self.renew()
                self.owned = False
                if current.holder == self.holder:  # our own key from before an outage: a new epoch
                    await self._revoke(holder_kv.lease)
                    continue
                return False
            try:
                won = await self._claim_txn(mono, epoch, epoch_kv, handoff_kv)
            except EtcdError as exc:
                self.owned = False
                raise self._unavailable("cannot claim lease", exc) from None
            if won:
                return True
        self.owned = False
        return False

    async def _claim_txn(
        self, mono: float, epoch: int, epoch_kv: KeyValue | None, handoff_kv: KeyValue | None
    ) -> bool:
        lease_id = await self.client.lease_grant(max(1, math.ceil(self.settings.ttl_s)))
        doc = HolderDoc(
            holder=self.holder,
            epoch=epoch + 1,
            router_id=self.settings.router_id,
            claimed_at=self.clock.wall(),
        )
        res = await self.client.txn(
            [
                cmp_create(self.holder_key, 0),
                cmp_mod(self.epoch_key, epoch_kv.mod_revision if epoch_kv else 0),
                cmp_mod(self.handoff_key, handoff_kv.mod_revision if handoff_kv else 0),
            ],
            [
                op_put(self.epoch_key, str(epoch + 1).encode()),
                op_put(self.holder_key, doc.encode(), lease_id),
            ],
        )
        if not res.succeeded:  # raced: someone claimed or wrote in between; read again
            await self.client.lease_revoke(lease_id)
            return False
        self.owned, self.verified = True, True
        self.epoch, self.previous_epoch = epoch + 1, parse_epoch(epoch_kv)
        self.lease_id, self.holder_rev = lease_id, res.revision
        self.handoff_rev = handoff_kv.mod_revision if handoff_kv else 0
        self.deadline = self._local_deadline(mono)
        self.last_error = ""
        log.info(
            "etcd lease claimed: epoch %d (lease %x, holder key revision %d)",
            self.epoch,
            lease_id,
            res.revision,
        )
        return True

    async def renew(self) -> bool:
        """Keep-alive + re-read of the holder key; False when lost (ownership cleared);
        ``LeaseError`` when etcd did not answer (deadline not extended: retried within validity)."""
        if not self.owned:
            return False
        mono = self.clock.monotonic()
        try:
            ttl = await self.client.lease_keepalive(self.lease_id)
            kv = await self.client.get(self.holder_key) if ttl > 0 else None
        except EtcdError as exc:
            raise self._unavailable("lease renewal failed", exc) from None
        if ttl <= 0 or kv is None or kv.create_revision != self.holder_rev:
            self.owned = False
            self.last_error = "etcd lease lost (holder key expired or replaced)"
            return False
        self.deadline = self._local_deadline(mono)
        self.verified = True
        self.last_error = ""
        return True

    async def release(self) -> None:
        """Revoke our etcd lease (the holder key goes with it); a successor's key is never touched."""
        if not self.owned:
            return
        self.owned = False
        await self._revoke(self.lease_id)

    async def _revoke(self, lease_id: int) -> None:
        try:
            await self.client.lease_revoke(lease_id)
        except EtcdError as exc:
            log.warning("etcd lease revoke failed (it expires after its TTL): %s", exc)

    async def peek(self) -> LeaseRecord | None:
        """The holder as a lease record (None: no holder key); ``LeaseError`` when unreadable."""
        try:
            kv = await self.client.get(self.holder_key)
        except EtcdError as exc:
            raise self._unavailable("cannot read lease", exc) from None
        if kv is None:
            return None
        doc = parse_holder(kv)
        now = self.clock.wall()  # the key exists, so its etcd lease is unexpired
        return LeaseRecord.of(doc.epoch, doc.holder, now + self.settings.ttl_s, doc.claimed_at)

    async def wait_vacant(self, timeout_s: float) -> None:
        """Return once the holder key is absent (a watch on it, not polling), or after ``timeout_s``."""
        try:
            await asyncio.wait_for(self._watch_until_vacant(), timeout_s)
        except (TimeoutError, EtcdError):
            return

    async def _watch_until_vacant(self) -> None:
        res = await self.client.txn([], [op_range(self.holder_key)])
        if not res.ranges()[0]:
            return
        async for ev in self.client.watch(self.holder_key, start_revision=res.revision + 1):
            if ev.type == "DELETE":
                return

    # -- the fenced handoff ----------------------------------------------------------------------
    async def write_handoff(self, doc: Handoff) -> None:
        """Store ``doc`` at ``<prefix>handoff`` only while our holder key stands; raises
        ``FencedWriteFailed`` (and marks the lease unverified) when the txn did not commit."""
        if not self.owned:
            raise FencedWriteFailed("this router does not hold the etcd lease")
        data = json.dumps(validate(doc).dump(), allow_nan=False).encode()
        for _ in range(2):
            try:
                res = await self.client.txn(
                    [
                        cmp_create(self.holder_key, self.holder_rev),
                        cmp_mod(self.handoff_key, self.handoff_rev),
                    ],
                    [op_put(self.handoff_key, data)],
                    [op_range(self.holder_key), op_range(self.handoff_key)],
                    retry_s=max(0.0, self.remaining() - 0.1),  # through a leader election
                )
            except EtcdError as exc:
                self.verified = False
                raise FencedWriteFailed(f"etcd handoff write not confirmed: {exc}") from None
            if res.succeeded:
                self.handoff_rev = res.revision
                return
            holder_kvs, handoff_kvs = res.ranges()
            if not holder_kvs or holder_kvs[0].create_revision != self.holder_rev:
                self.owned = False
                raise FencedWriteFailed(
                    "etcd lease lost: the holder key is gone or belongs to another router"
                )
            current = handoff_kvs[0] if handoff_kvs else None
            if current is not None and self._is_ours(current):
                self.handoff_rev = current.mod_revision  # an earlier write of ours did commit
                continue
            self.verified = False
            if current is None:
                raise FencedWriteFailed(f"etcd key {self.handoff_key.decode()} was deleted by someone else")
            parse_handoff(current, self.settings.model)  # raises for a foreign/torn document
            raise FencedWriteFailed(f"etcd key {self.handoff_key.decode()} was written by another router")
        raise FencedWriteFailed("etcd handoff write raced with itself")

    def _is_ours(self, kv: KeyValue) -> bool:
        try:
            doc = parse_handoff(kv, self.settings.model)
        except EtcdKeyRefused:
            return False
        return doc.holder == self.holder and doc.epoch == self.epoch

    async def read_handoff(self) -> tuple[Handoff | None, int]:
        """The stored handoff and the epoch counter (``EtcdKeyRefused`` for a foreign or torn one)."""
        try:
            _, epoch_kv, handoff_kv = await self._read_keys()
        except EtcdError as exc:
            raise self._unavailable("cannot read etcd handoff", exc) from None
        epoch = parse_epoch(epoch_kv)
        return (parse_handoff(handoff_kv, self.settings.model) if handoff_kv else None), epoch
