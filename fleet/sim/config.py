"""Static engine settings (from the command line) and run-time faults (``/sim/faults``)."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fleet.contract import DEFAULT_CONTRACT


@dataclass(frozen=True)
class SimConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    advertise_host: str = ""  # remote_host in descriptors (default: host, or the hostname for 0.0.0.0)
    model: str = "sim-model"
    iid: str = "e0"
    version: str = "0.11.0"
    kv_layout: str = "nixl-v1"
    contract: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_CONTRACT))
    ttft_base_ms: float = 5.0
    ttft_per_token_ms: float = 0.05
    itl_ms: float = 2.0
    max_concurrency: int = 256
    seed: int = 0
    kv_lease_s: int = 60
    block_size: int = 16
    max_model_len: int = 8192
    sse_line_ending: Literal["lf", "crlf", "cr"] = "lf"  # how streamed SSE lines end
    attestation: bool = True  # serve GET /v1/attestation itself (off: a narwhal-attest sidecar does)
    error_rate: float = 0.0  # a degraded build: this share of requests fails from the start (500)

    @property
    def descriptor_host(self) -> str:
        if self.advertise_host:
            return self.advertise_host
        if self.host in ("0.0.0.0", "::", ""):
            return socket.gethostname()
        return self.host

    def kv_transfer_config(self) -> dict[str, Any]:
        return {
            "kv_connector": "NixlConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"kv_lease_duration": self.kv_lease_s, "kv_layout": self.kv_layout},
        }

    def launch(self) -> dict[str, Any]:
        """The launch record an attestation sidecar would capture for a real vLLM engine."""
        return {
            "args": [
                "--model",
                self.model,
                "--max-num-seqs",
                str(self.max_concurrency),
                "--max-model-len",
                str(self.max_model_len),
                "--kv-transfer-config",
                json.dumps(self.kv_transfer_config(), sort_keys=True, separators=(",", ":")),
                *(["--error-rate", str(self.error_rate)] if self.error_rate else []),
            ],
            "kv_transfer_config": self.kv_transfer_config(),
        }


class Faults(BaseModel):
    """Injected faults; ``POST /sim/faults`` merges a partial document into the current one."""

    model_config = ConfigDict(extra="forbid", strict=True)

    health_fail: bool = False
    hang: bool = False
    slow_ms: float = Field(default=0.0, ge=0)
    error_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    wrong_model: str | None = None
    kv_layout: str | None = None
    break_descriptor: bool | Literal["missing", "garbled"] = False
    attestation: Literal["ok", "broken", "fail"] = "ok"
    generation_fail: bool = False
    stall_body: bool = False  # a buffered answer: head and half the body, then silence until cleared

    def merged(self, patch: dict[str, Any]) -> Faults:
        data = self.model_dump()
        data.update(patch)
        return Faults.model_validate(data)
