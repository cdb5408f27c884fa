"""A small asyncio client for etcd's v3 JSON gateway (``/v3/...``, etcd ≥ 3.4) over httpx.

Only what the router needs: ``range``, ``put``, ``txn`` (compare / success / failure), ``lease
grant / keepalive / revoke`` and ``watch`` (a streaming response, one JSON object per event
batch). Keys and values are bytes here and base64 on the wire; the gateway omits zero values
(``"0"``, ``false``, empty lists), so every read defaults them.

Endpoints are tried in order, starting from the last one that answered; a connection error,
timeout or 5xx/unavailable answer moves on to the next. When no endpoint answers,
``EtcdUnavailable`` is raised (with every endpoint's reason); a well-formed refusal from etcd
(``EtcdError``) is not retried. Consensus is etcd's: this module never decides anything.

Security (``EtcdSecurity``): TLS with a CA file (``https://`` endpoints; without one the system
CAs), a client certificate and key (etcd ``--client-cert-auth``), and etcd's own authentication —
user and password exchanged at ``/v3/auth/authenticate`` for a token sent as ``Authorization`` on
every call (a token etcd no longer accepts is replaced once, then the call is repeated).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx


class EtcdError(RuntimeError):
    """etcd answered, but refused the request (bad request, unknown lease, compaction, …)."""


class EtcdUnavailable(EtcdError):
    """No endpoint answered in time (down, partitioned, no quorum)."""


def parse_endpoints(raw: str | Sequence[str]) -> tuple[str, ...]:
    """``http://host:port[,http://host:port…]`` → normalized URLs; ``ValueError`` names the bad one."""
    items = raw.split(",") if isinstance(raw, str) else list(raw)
    out: list[str] = []
    for item in items:
        text = item.strip()
        if not text:
            raise ValueError("empty etcd endpoint")
        try:
            parts = urlsplit(text)
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"etcd endpoint {text!r} is not a URL: {exc}") from None
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"etcd endpoint {text!r} must start with http:// or https://")
        if not parts.hostname:
            raise ValueError(f"etcd endpoint {text!r} has no host")
        if port is None:
            raise ValueError(f"etcd endpoint {text!r} has no port")
        if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
            raise ValueError(f"etcd endpoint {text!r} must be scheme://host:port only")
        out.append(f"{parts.scheme}://{parts.netloc}")
    if not out:
        raise ValueError("no etcd endpoint given")
    return tuple(out)


@dataclass(frozen=True, slots=True)
class EtcdSecurity:
    """TLS files and etcd credentials for the client (all optional; empty = not used)."""

    cacert: str = ""  # PEM CA bundle that signed the members' certificates
    cert: str = ""  # PEM client certificate (with ``key``)
    key: str = ""
    user: str = ""  # etcd user (with ``password``)
    password: str = field(default="", repr=False)

    @property
    def tls(self) -> bool:
        return bool(self.cacert or self.cert)

    def problems(self, endpoints: Sequence[str]) -> list[str]:
        """What is wrong with these settings for ``endpoints`` ([] = usable); flag names in messages."""
        out: list[str] = []
        if bool(self.cert) != bool(self.key):
            out.append("--etcd-cert and --etcd-key go together")
        for flag, path in (
            ("--etcd-cacert", self.cacert),
            ("--etcd-cert", self.cert),
            ("--etcd-key", self.key),
        ):
            if path and not os.path.isfile(path):
                out.append(f"{flag}: {path} is not a readable file")
        if self.tls and not all(e.startswith("https://") for e in endpoints):
            out.append("--etcd-cacert/--etcd-cert need https:// etcd endpoints")
        if self.user and not self.password:
            out.append(f"etcd user {self.user!r} has no password (--etcd-password-env names the variable)")
        return out

    def ssl_context(self) -> ssl.SSLContext | None:
        """The verifying context (None: httpx's default verification)."""
        if not self.tls:
            return None
        ctx = ssl.create_default_context(cafile=self.cacert or None)
        if self.cert:
            ctx.load_cert_chain(self.cert, self.key)
        return ctx


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that selects every key starting with ``prefix``."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\x00"


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> KeyValue:
        return cls(
            key=unb64(doc.get("key", "")),
            value=unb64(doc.get("value", "")),
            create_revision=int(doc.get("create_revision", 0)),
            mod_revision=int(doc.get("mod_revision", 0)),
            version=int(doc.get("version", 0)),
            lease=int(doc.get("lease", 0)),
        )


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str  # "PUT" | "DELETE"
    kv: KeyValue


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int
    responses: list[dict[str, Any]] = field(default_factory=list)

    def ranges(self) -> list[list[KeyValue]]:
        """The key-values of each ``request_range`` response, in order."""
        out: list[list[KeyValue]] = []
        for r in self.responses:
            if "response_range" in r:
                out.append([KeyValue.from_json(kv) for kv in r["response_range"].get("kvs", [])])
        return out


# -- txn building blocks (the gateway's JSON mapping of the protobuf messages) -------------------


def cmp_create(key: bytes, revision: int) -> dict[str, Any]:
    """Compare: the key's create revision equals ``revision`` (0: the key does not exist)."""
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": str(revision)}


def cmp_mod(key: bytes, revision: int) -> dict[str, Any]:
    """Compare: the key's last modification revision equals ``revision`` (0: absent)."""
    return {"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}


def op_put(key: bytes, value: bytes, lease: int = 0) -> dict[str, Any]:
    req: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease:
        req["lease"] = str(lease)
    return {"request_put": req}


def op_range(key: bytes, range_end: bytes | None = None) -> dict[str, Any]:
    req = {"key": b64(key)}
    if range_end is not None:
        req["range_end"] = b64(range_end)
    return {"request_range": req}


def op_delete(key: bytes) -> dict[str, Any]:
    return {"request_delete_range": {"key": b64(key)}}


class EtcdClient:
    """One httpx connection pool over the configured endpoints; every call has a timeout."""

    def __init__(
        self,
        endpoints: Sequence[str] | str,
        timeout_s: float = 1.0,
        retry_s: float = 0.0,
        security: EtcdSecurity | None = None,
    ) -> None:
        self.endpoints = parse_endpoints(endpoints)
        self.timeout_s = timeout_s
        self.retry_s = retry_s  # keep cycling the endpoints this long (a leader election takes ~1 s)
        self._first = 0  # the endpoint that answered last is tried first
        self.security = security or EtcdSecurity()
        ctx = self.security.ssl_context()
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s), trust_env=False, verify=ctx if ctx is not None else True
        )
        self._token = ""  # etcd auth token (with a user)

    async def aclose(self) -> None:
        await self._http.aclose()

    def _order(self) -> list[str]:
        n = len(self.endpoints)
        return [self.endpoints[(self._first + i) % n] for i in range(n)]

    async def call(
        self, path: str, body: dict[str, Any], timeout_s: float | None = None, retry_s: float | None = None
    ) -> dict[str, Any]:
        """POST ``/v3/<path>`` to the first endpoint that answers, cycling through the endpoints for
        up to ``retry_s`` (default: the client's); ``EtcdUnavailable`` when none did."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + (self.retry_s if retry_s is None else retry_s)
        while True:
            try:
                return await self._call_once(path, body, timeout_s)
            except EtcdUnavailable:
                if loop.time() + 0.05 >= give_up:
                    raise
            await asyncio.sleep(0.05)

    async def _headers(self, url: str, limits: httpx.Timeout) -> dict[str, str]:
        """``Authorization: <token>`` with a user (authenticating first); {} without one."""
        sec = self.security
        if not sec.user:
            return {}
        if not self._token:
            r = await self._http.post(
                f"{url}/v3/auth/authenticate",
                json={"name": sec.user, "password": sec.password},
                timeout=limits,
            )
            doc = _json(r)
            if r.status_code >= 500 or _unavailable(doc):
                raise httpx.TransportError(f"HTTP {r.status_code} {_message(doc)}")
            if r.status_code != 200 or not doc.get("token"):
                raise EtcdError(
                    f"etcd authentication as {sec.user!r} refused: HTTP {r.status_code} {_message(doc)}".rstrip()
                )
            self._token = str(doc["token"])
        return {"authorization": self._token}

    async def _post(self, url: str, path: str, body: dict[str, Any], limits: httpx.Timeout) -> httpx.Response:
        r = await self._http.post(
            f"{url}/v3/{path}", json=body, timeout=limits, headers=await self._headers(url, limits)
        )
        if self.security.user and _auth_expired(_json(r)):
            self._token = ""  # expired or from before a restart: a new one, once
            r = await self._http.post(
                f"{url}/v3/{path}", json=body, timeout=limits, headers=await self._headers(url, limits)
            )
        return r

    async def _call_once(self, path: str, body: dict[str, Any], timeout_s: float | None) -> dict[str, Any]:
        reasons: list[str] = []
        timeout = httpx.Timeout(timeout_s if timeout_s is not None else self.timeout_s)
        for url in self._order():
            try:
                r = await self._post(url, path, body, timeout)
            except (httpx.HTTPError, OSError) as exc:  # (an ssl.SSLError can escape httpx's mapping)
                reasons.append(f"{url}: {_describe(exc)}")
                continue
            doc = _json(r)
            if r.status_code >= 500 or r.status_code == 429 or _unavailable(doc):
                reasons.append(f"{url}: HTTP {r.status_code} {_message(doc)}".rstrip())
                continue
            self._first = self.endpoints.index(url)
            if r.status_code != 200:
                raise EtcdError(f"etcd {path}: HTTP {r.status_code} {_message(doc)}".rstrip())
            if "error" in doc and "header" not in doc and "result" not in doc:
                raise EtcdError(f"etcd {path}: {_message(doc)}")
            return doc
        raise EtcdUnavailable(f"etcd unavailable ({'; '.join(reasons)})")

    # -- KV ----------------------------------------------------------------------------------
    async def get(self, key: bytes) -> KeyValue | None:
        kvs = await self.range(key)
        return kvs[0] if kvs else None

    async def range(self, key: bytes, range_end: bytes | None = None) -> list[KeyValue]:
        body: dict[str, Any] = {"key": b64(key)}
        if range_end is not None:
            body["range_end"] = b64(range_end)
        doc = await self.call("kv/range", body)
        return [KeyValue.from_json(kv) for kv in doc.get("kvs", [])]

    async def get_prefix(self, prefix: bytes) -> list[KeyValue]:
        return await self.range(prefix, prefix_end(prefix))

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        """Unconditional put; returns the revision it created."""
        body = op_put(key, value, lease)["request_put"]
        doc = await self.call("kv/put", body)
        return int(doc.get("header", {}).get("revision", 0))

    async def delete(self, key: bytes) -> int:
        doc = await self.call("kv/deleterange", {"key": b64(key)})
        return int(doc.get("deleted", 0))

    async def txn(
        self,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]] | None = None,
        retry_s: float | None = None,
    ) -> TxnResult:
        body = {"compare": compare, "success": success, "failure": failure or []}
        doc = await self.call("kv/txn", body, retry_s=retry_s)
        return TxnResult(
            succeeded=bool(doc.get("succeeded", False)),
            revision=int(doc.get("header", {}).get("revision", 0)),
            responses=list(doc.get("responses", [])),
        )

    # -- leases ------------------------------------------------------------------------------
    async def lease_grant(self, ttl_s: int) -> int:
        doc = await self.call("lease/grant", {"TTL": str(ttl_s)})
        if doc.get("error"):
            raise EtcdError(f"etcd lease grant: {doc['error']}")
        return int(doc["ID"])

    async def lease_keepalive(self, lease_id: int) -> int:
        """One keep-alive; returns the lease's new TTL, 0 when the lease is gone (expired/revoked)."""
        doc = await self.call("lease/keepalive", {"ID": str(lease_id)})
        result = doc.get("result", doc)
        return int(result.get("TTL", 0))

    async def lease_revoke(self, lease_id: int) -> None:
        try:
            await self.call("lease/revoke", {"ID": str(lease_id)})
        except EtcdError as exc:
            if "not found" not in str(exc):
                raise

    # -- watch -------------------------------------------------------------------------------
    async def watch(
        self, key: bytes, start_revision: int = 0, range_end: bytes | None = None
    ) -> AsyncIterator[WatchEvent]:
        """Events on ``key`` (or the range) from ``start_revision``; ends (raises
        ``EtcdUnavailable``) when the stream breaks, so the caller re-reads and re-watches."""
        req: dict[str, Any] = {"key": b64(key)}
        if range_end is not None:
            req["range_end"] = b64(range_end)
        if start_revision:
            req["start_revision"] = str(start_revision)
        reasons: list[str] = []
        for url in self._order():
            try:
                timeout = httpx.Timeout(self.timeout_s, read=None)
                headers = await self._headers(url, httpx.Timeout(self.timeout_s))
                async with self._http.stream(
                    "POST", f"{url}/v3/watch", json={"create_request": req}, timeout=timeout, headers=headers
                ) as r:
                    if r.status_code != 200:
                        reasons.append(f"{url}: HTTP {r.status_code}")
                        continue
                    self._first = self.endpoints.index(url)
                    async for line in r.aiter_lines():
                        if not line.strip():
                            continue
                        doc = json.loads(line)
                        result = doc.get("result", {})
                        if self.security.user and _auth_expired(doc):
                            self._token = ""
                        if "error" in doc or result.get("canceled"):
                            raise EtcdError(f"etcd watch canceled: {result.get('cancel_reason') or doc}")
                        for ev in result.get("events", []):
                            yield WatchEvent(ev.get("type", "PUT"), KeyValue.from_json(ev.get("kv", {})))
                    reasons.append(f"{url}: watch stream ended")
            except (httpx.HTTPError, OSError) as exc:  # (an ssl.SSLError can escape httpx's mapping)
                reasons.append(f"{url}: {_describe(exc)}")
        raise EtcdUnavailable(f"etcd watch unavailable ({'; '.join(reasons)})")


def _json(r: httpx.Response) -> dict[str, Any]:
    try:
        doc = r.json()
    except ValueError:
        return {"error": r.text[:200]}
    return doc if isinstance(doc, dict) else {"error": repr(doc)[:200]}


def _message(doc: dict[str, Any]) -> str:
    return str(doc.get("message") or doc.get("error") or "")


def _unavailable(doc: dict[str, Any]) -> bool:
    """gRPC Unavailable (14) / DeadlineExceeded (4) mapped by the gateway: try another member."""
    code = doc.get("code")
    return code in (4, 14) or "leader changed" in _message(doc) or "no leader" in _message(doc)


def _auth_expired(doc: dict[str, Any]) -> bool:
    """gRPC Unauthenticated (16) or etcd's "invalid auth token": authenticate again."""
    return doc.get("code") == 16 or "invalid auth token" in _message(doc)


def _describe(exc: Exception) -> str:
    """The exception class, and for TLS failures why (a refused or missing certificate)."""
    name = type(exc).__name__
    text = str(exc)
    if any(w in text for w in ("SSL", "certificate", "CERTIFICATE", "TLS")):
        return f"{name}: {text[:160]}"
    return name
