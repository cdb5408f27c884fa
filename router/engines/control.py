"""The router's one engine-control client (spec §6.3, §6.4): one shared httpx client.

Every control-plane call the router makes to an engine goes through here — the lifecycle's
readmission checks and monitor, the breaker's recovery probe (router/probes.py), the learned
context length (router/context_limits.py) and active-active adoption (router/replicas/wiring.py);
``assemble`` builds one ``EngineControl`` and hands it to each. (Client traffic and the breaker's
fabric probe go over the data-plane legs, router/engines/legs.py.)

Health, live identity (``/version`` + ``/metrics`` process start), attestation, model list, a direct
generation and the fabric (prefill → descriptor → decode) check. Every call raises on failure so
the caller can name the exception (``process identity unreadable: ConnectError``); only ``health``
answers a bool (and ``generation_ok``, the breaker's form of ``generate``). Timeouts come from ``engine.health_timeout_s`` (control reads),
``serving.prefill_timeout_s`` (generation, prefill leg) and the decode first-token/read bounds.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from router.builds import EngineBuilds
from router.config import EngineSpec, FleetConfig
from router.engines.identity import ProcessStartError, read_process_start
from router.engines.legs import find_descriptor

GENERATION_PROMPT = "narwhal lifecycle generation check"
FABRIC_PROMPT = "narwhal lifecycle fabric check"


class EngineAnswerError(Exception):
    """An engine answered, but not with what the check needs (status, shape, values)."""


def describe(exc: BaseException) -> str:
    """``ConnectError`` for transport failures, ``Type: message`` for everything else."""
    name = type(exc).__name__
    if isinstance(exc, httpx.TransportError | TimeoutError) or not str(exc):
        return name
    return f"{name}: {exc}"


@dataclass(frozen=True, slots=True)
class Identity:
    version: str
    process_start: float


def parse_process_start(text: str) -> float:
    try:
        return read_process_start(text)
    except ProcessStartError as exc:
        raise EngineAnswerError(str(exc)) from None


def _refusal_reason(resp: httpx.Response) -> str:
    """The message of an error body (``{"error": {"message": ...}}`` or ``{"error": "..."}``), if any."""
    try:
        doc = orjson.loads(resp.content)
    except orjson.JSONDecodeError:
        return ""
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict):
        err = err.get("message")
    return str(err)[:300] if isinstance(err, str) and err else ""


def _json(resp: httpx.Response, what: str) -> Any:
    if resp.status_code != 200:
        reason = _refusal_reason(resp)
        raise EngineAnswerError(
            f"{what} answered HTTP {resp.status_code}" + (f": {reason}" if reason else "")
        )
    try:
        return orjson.loads(resp.content)
    except orjson.JSONDecodeError:
        raise EngineAnswerError(f"{what} is not JSON") from None


def _tokens_in(doc: Any) -> int:
    """Tokens carried by one completion chunk or answer: token_ids, else non-empty text."""
    if not isinstance(doc, dict):
        return 0
    if "error" in doc:
        raise EngineAnswerError(f"decode leg reported an error: {str(doc['error'])[:200]}")
    n = 0
    for choice in doc.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        ids = choice.get("token_ids")
        if isinstance(ids, list) and ids:
            n += len(ids)
        elif choice.get("text") or (isinstance(choice.get("delta"), dict) and choice["delta"].get("content")):
            n += 1
    return n


class EngineControl:
    """A router component owning the control-plane client (no routes)."""

    def __init__(self, config: FleetConfig, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        eng = config.engine
        self.headers: dict[str, str] = {}
        if eng.engine_api_key_env and os.environ.get(eng.engine_api_key_env):
            self.headers["authorization"] = f"Bearer {os.environ[eng.engine_api_key_env]}"
        self.control_timeout = httpx.Timeout(eng.health_timeout_s)
        self.builds: EngineBuilds | None = None  # told every identity and attestation read (router/builds.py)
        self.prefill_timeout = httpx.Timeout(config.serving.prefill_timeout_s, connect=eng.health_timeout_s)
        self.decode_timeout = httpx.Timeout(eng.decode_read_timeout_s, connect=eng.health_timeout_s)

    # -- component protocol -----------------------------------------------------------------
    def add_routes(self, app: Any) -> None:
        return None

    async def start(self) -> None:
        self.client()

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            limits = httpx.Limits(max_connections=64, max_keepalive_connections=16)
            self._client = httpx.AsyncClient(transport=self._transport, limits=limits, trust_env=False)
        return self._client

    def spec(self, iid: str) -> EngineSpec:
        return self.config.engine_by_id(iid)

    # -- reads ------------------------------------------------------------------------------
    async def health(self, iid: str) -> bool:
        try:
            resp = await self.client().get(self.spec(iid).url + "/health", timeout=self.control_timeout)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    async def identity(self, iid: str) -> Identity:
        url = self.spec(iid).url
        c = self.client()
        version_doc = _json(
            await c.get(url + "/version", headers=self.headers, timeout=self.control_timeout), "/version"
        )
        version = version_doc.get("version") if isinstance(version_doc, dict) else None
        if not isinstance(version, str) or not version:
            raise EngineAnswerError("/version has no version string")
        identity = Identity(version, await self.process_start(iid))
        if self.builds is not None:
            self.builds.saw_identity(iid, identity.version, identity.process_start)
        return identity

    async def process_start(self, iid: str) -> float:
        """The live process start alone (``/metrics``): what tells a restarted process apart."""
        metrics = await self.client().get(
            self.spec(iid).url + "/metrics", headers=self.headers, timeout=self.control_timeout
        )
        if metrics.status_code != 200:
            raise EngineAnswerError(f"/metrics answered HTTP {metrics.status_code}")
        return parse_process_start(metrics.text)

    async def attestation(self, iid: str) -> Any:
        url = self.spec(iid).attestation_url
        if not url:
            raise EngineAnswerError("attestation_url is not configured")
        doc = _json(await self.client().get(url, timeout=self.control_timeout), "attestation")
        if self.builds is not None:
            self.builds.saw_attestation(iid, doc)
        return doc

    async def models(self, iid: str) -> list[str]:
        resp = await self.client().get(
            self.spec(iid).url + "/v1/models", headers=self.headers, timeout=self.control_timeout
        )
        doc = _json(resp, "/v1/models")
        data = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(data, list):
            raise EngineAnswerError("/v1/models has no data list")
        return [str(m.get("id")) for m in data if isinstance(m, dict) and "id" in m]

    async def context_length(self, iid: str) -> int | None:
        """The ``max_model_len`` the engine reports for the configured model (None: not reported)."""
        resp = await self.client().get(
            self.spec(iid).url + "/v1/models", headers=self.headers, timeout=self.control_timeout
        )
        doc = _json(resp, "/v1/models")
        data = doc.get("data") if isinstance(doc, dict) else None
        for entry in data if isinstance(data, list) else ():
            if isinstance(entry, dict) and entry.get("id") == self.config.model:
                value = entry.get("max_model_len")
                if type(value) is int and value > 0:
                    return value
        return None

    # -- generation -------------------------------------------------------------------------
    async def generate(self, iid: str, request_id: str = "") -> None:
        """A direct 1-token generation: raises unless 200 with a non-empty ``choices`` list."""
        body = {
            "model": self.config.model,
            "prompt": GENERATION_PROMPT,
            "max_tokens": 1,
            "temperature": 0.0,
            "stream": False,
        }
        resp = await self.client().post(
            self.spec(iid).url + "/v1/completions",
            content=orjson.dumps(body),
            headers={
                **self.headers,
                "content-type": "application/json",
                "x-request-id": request_id or f"narwhal-gen-{iid}",
            },
            timeout=self.prefill_timeout,
        )
        doc = _json(resp, "generation")
        choices = doc.get("choices") if isinstance(doc, dict) else None
        if not isinstance(choices, list) or not choices:
            raise EngineAnswerError("generation answered no choices")

    async def generation_ok(self, iid: str, request_id: str = "") -> bool:
        """``generate`` as a yes/no: False on any transport failure or unusable answer."""
        try:
            await self.generate(iid, request_id)
        except (httpx.HTTPError, EngineAnswerError):
            return False
        return True

    async def fabric_prefill(self, src: str) -> dict[str, Any]:
        """Prefill leg on the producer; returns its KV descriptor."""
        body = {
            "model": self.config.model,
            "prompt": FABRIC_PROMPT,
            "max_tokens": 1,
            "temperature": 0.0,
            "stream": False,
            "kv_transfer_params": {"do_remote_decode": True},
        }
        resp = await self.client().post(
            self.spec(src).url + "/v1/completions",
            content=orjson.dumps(body),
            headers={
                **self.headers,
                "content-type": "application/json",
                "x-request-id": f"narwhal-fabric-{src}-prefill",
            },
            timeout=self.prefill_timeout,
        )
        descriptor = find_descriptor(_json(resp, "prefill leg"))
        if descriptor is None:
            raise EngineAnswerError("prefill leg answered no KV descriptor")
        return descriptor

    async def fabric_decode(self, dst: str, descriptor: dict[str, Any]) -> int:
        """Decode leg on the consumer with the producer's descriptor; returns the tokens received."""
        body = {
            "model": self.config.model,
            "prompt": FABRIC_PROMPT,
            "max_tokens": 2,
            "min_tokens": 2,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "return_token_ids": True,
            "kv_transfer_params": descriptor,
        }
        headers = {
            **self.headers,
            "content-type": "application/json",
            "x-request-id": f"narwhal-fabric-{dst}-decode",
        }
        url = self.spec(dst).url + "/v1/completions"
        async with self.client().stream(
            "POST", url, content=orjson.dumps(body), headers=headers, timeout=self.decode_timeout
        ) as resp:
            if resp.status_code != 200:
                await resp.aread()
                raise EngineAnswerError(f"decode leg answered HTTP {resp.status_code}")
            if "text/event-stream" not in resp.headers.get("content-type", ""):
                tokens = _tokens_in(orjson.loads(await resp.aread()))
            else:
                tokens = await self._stream_tokens(resp)
        if tokens < 1:
            raise EngineAnswerError("decode leg produced no tokens")
        return tokens

    async def _stream_tokens(self, resp: httpx.Response) -> int:
        tokens = 0
        lines = resp.aiter_lines()
        first_token_s = self.config.engine.first_token_timeout_s
        while True:
            try:
                if tokens == 0:
                    line = await asyncio.wait_for(anext(lines), timeout=first_token_s)
                else:
                    line = await anext(lines)
            except StopAsyncIteration:
                raise EngineAnswerError("decode stream ended without [DONE]") from None
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                return tokens
            try:
                tokens += _tokens_in(orjson.loads(payload))
            except orjson.JSONDecodeError:
                raise EngineAnswerError("decode stream sent a malformed event") from None
