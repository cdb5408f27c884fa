"""Fleet file (`narwhal.fleet` v2) → frozen pydantic models. Every default lives here.

A Narwhal 0.7.0 fleet file is accepted unchanged. The keys of 0.7.0 subsystems this router does
not implement are fields here too (typed, default ``None``): accepted and reported once at start-up
as "accepted, not used" (the registry of used and unused keys, and the explicit list of these
peer-compatibility keys, is ``router/config_keys.py``). Any other key is an error naming the key and
the file: no section accepts keys it does not name. Keys starting with ``_`` are comments (as in
0.7.0's own ``fleet.example.json``) and are dropped before validation. Numbers must be finite
(``NaN``/``Infinity`` are refused naming the key) and limits carry their ranges here, so a negative
limit is an error too.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from router.ids import EngineId, EngineUrl, check_engine_url

Role = Literal["prefill", "decode"]
RestartPolicy = Literal["individual", "whole_wave"]

CONTRACT_FIELDS: tuple[str, ...] = (
    "engine_version",
    "image_digest",
    "transfer_version",
    "connector_version",
    "model_architecture",
    "model_dtype",
    "kv_heads",
    "head_size",
    "hidden_layers",
    "attention_backend",
    "kv_cache_dtype",
    "cross_layers_blocks",
    "hybrid_kv_cache_manager",
    "connector",
    "kv_role",
    "transfer_mode",
    "speculative_config",
    "enforce_handshake_compat",
)
LEGACY_CONTRACT_NAMES = {
    "vllm_version": "engine_version",
    "nixl_version": "transfer_version",
    "nixl_connector_version": "connector_version",
}


class ConfigError(ValueError):
    """A fleet file that cannot be used; the message names the file and the key."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class _Section(_Frozen):
    """A section whose unknown keys are refused as ``unknown key <section>.<key>`` (the message the
    CLI prints, naming the file); ``extra="allow"`` only so the validator can name the section."""

    model_config = ConfigDict(frozen=True, extra="allow", allow_inf_nan=False)
    _section: ClassVar[str] = ""

    @model_validator(mode="after")
    def _no_extras(self) -> Self:
        for key in sorted(self.model_extra or {}):
            raise ValueError(f"unknown key {self._section}.{key}")
        return self


# Sub-keys Narwhal 0.7.0 accepts inside its object-valued settings (accepted, not used here);
# any other sub-key is an error, as in 0.7.0.
PEER_OBJECT_KEYS: dict[str, frozenset[str]] = {
    "hardware": frozenset({"accelerator", "accelerators_per_engine", "tensor_parallel"}),
    "engines[].shared_device": frozenset({"group", "gpu_uuid", "device_allowance", "gpu_memory_utilization"}),
    "recovery.health": frozenset(
        {
            "window_s",
            "drift_band",
            "min_samples",
            "probation_windows",
            "evict_windows",
            "recovery_windows",
            "probation_penalty_s",
            "relative_band",
        }
    ),
    "controller.thresholds": frozenset(
        {
            "expand",
            "shrink",
            "cooldown_s",
            "sustained_intervals",
            "dwell_s",
            "panic_ratio",
            "flip_resident_guard",
        }
    ),
    "controller.reactive": frozenset(
        {
            "window_s",
            "evidence_span_s",
            "evidence_max_span_s",
            "evidence_min_arrivals",
            "demand_rise_tolerance",
            "confirmations",
            "utilization",
            "min_arrivals",
            "demand_floor",
            "movement_margin",
            "step_s",
            "decode_correction_min",
            "decode_correction_max",
            "decode_correction_alpha",
            "decode_correction_min_samples",
        }
    ),
    "profiles": frozenset({"path", "max_decode_fit_mape", "max_decode_cv_mape"}),
}


def check_peer_object(key: str, value: dict[str, Any] | None) -> dict[str, Any] | None:
    """``ValueError`` naming ``<key>.<sub-key>`` for a sub-key 0.7.0 does not accept either."""
    if value is not None:
        for sub in sorted(value):
            if sub not in PEER_OBJECT_KEYS[key]:
                raise ValueError(f"unknown key {key}.{sub}")
    return value


class EngineSpec(_Frozen):
    iid: EngineId  # [A-Za-z0-9._-]{1,64}: it reaches restart commands, workflow ids and file names
    url: EngineUrl  # a plain http(s) base URL (router/ids.py)
    role: Role = "decode"
    pin: bool = False
    attestation_url: str = ""
    shared_device: str | dict[str, Any] | None = None  # a label, or 0.7.0's allocation object

    @field_validator("attestation_url")
    @classmethod
    def _attestation_url(cls, v: str) -> str:
        return check_engine_url(v, "attestation_url") if v else v

    @field_validator("shared_device")
    @classmethod
    def _shared_device(cls, v: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        return check_peer_object("engines[].shared_device", v) if isinstance(v, dict) else v


class EngineSettings(_Frozen):
    backend: Literal["vllm"] = "vllm"
    connector: Literal["nixl"] = "nixl"
    dialect: Literal["vllm"] = "vllm"
    health_timeout_s: float = Field(default=5.0, gt=0)
    first_token_timeout_s: float = Field(default=2.5, gt=0)
    decode_read_timeout_s: float = Field(default=10.0, gt=0)
    engine_api_key_env: str = ""
    tokenize: bool = True  # accepted, unused: exact sizing via /tokenize is not implemented
    # Narwhal 0.7.0 keys, accepted, not used (router/config_keys.py PEER_COMPAT)
    chars_per_token: float | None = None
    tokenize_timeout_s: float | None = None
    control_connections: int | None = None
    pool_timeout_s: float | None = None
    connect_timeout_s: float | None = None
    first_token_calibration_path: str | None = None


class ServingSettings(_Section):
    _section: ClassVar[str] = "serving"
    request_timeout_s: float = Field(default=600.0, gt=0)
    prefill_timeout_s: float = Field(default=120.0, gt=0)
    max_connections: int = Field(default=768, ge=1)
    queue_capacity: int = Field(default=0, ge=0)
    queue_timeout_s: float = Field(default=0.0, ge=0)
    max_attempts: int = Field(default=2, ge=1)
    max_request_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    max_response_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    client_write_timeout_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    # a request's max_tokens above this (or above the smallest max_model_len the engines report
    # in /v1/models) is a 400 before any engine is touched; None: only the reported context bounds
    max_tokens_limit: int | None = Field(default=None, ge=1)
    graceful_timeout_s: float = Field(default=30.0, ge=0)
    # connection hygiene (router/connections.py)
    max_client_connections: int = Field(default=4096, ge=1)
    header_timeout_s: float = Field(default=10.0, gt=0, allow_inf_nan=False)
    idle_timeout_s: float = Field(default=15.0, gt=0, allow_inf_nan=False)
    fd_reserve: int = Field(default=64, ge=0)
    # Narwhal 0.7.0 keys, accepted, not used (router/config_keys.py PEER_COMPAT)
    admission: str | None = None
    admission_margin: float | None = None
    retry_base_s: float | None = None
    retry_cap_s: float | None = None
    retry_budget: float | None = None
    retry_replenish: float | None = None


class SLOSettings(_Frozen):
    """Service-level objectives (spec §8 ``slo_met``)."""

    ttft_s: float = Field(gt=0, allow_inf_nan=False)
    tpot_s: float = Field(gt=0, allow_inf_nan=False)


class RecoverySettings(_Section):
    _section: ClassVar[str] = "recovery"
    state_path: str = "runs/state.json"
    resume: bool = False
    engine_restart_policy: RestartPolicy = "individual"
    eject_after: int = Field(default=3, ge=1)
    readmit_every: int = Field(default=10, ge=1)
    liveness_every: int = Field(default=10, ge=0)
    liveness_misses: int = Field(default=2, ge=1)
    failure_quarantine_s: float = Field(default=0.0, ge=0)
    health: dict[str, Any] | None = None  # drift ejection (0.7.0): accepted, unused

    @field_validator("health")
    @classmethod
    def _health(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return check_peer_object("recovery.health", v)


class ControllerSettings(_Section):
    _section: ClassVar[str] = "controller"
    monitor_interval_s: float = Field(default=1.0, gt=0)
    monitor_failure_limit: int = Field(default=5, ge=1)
    min_prefill: int = Field(default=1, ge=0)
    min_decode: int = Field(default=1, ge=0)
    # the role controller of Narwhal 0.7.0: accepted, not used (router/config_keys.py PEER_COMPAT)
    advisory: bool | None = None
    flip_history: int | None = None
    thresholds: dict[str, Any] | None = None
    reactive: dict[str, Any] | None = None

    @field_validator("thresholds", "reactive")
    @classmethod
    def _peer_objects(cls, v: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        return check_peer_object(f"controller.{info.field_name}", v)


class ControlSettings(_Frozen):
    """Control-plane security and listener (our extension, ``control`` key)."""

    token_env: str = ""  # env var holding the bearer token for /narwhal/* mutations
    protect_reads: bool = False  # also require the token for /narwhal/* reads
    host: str = ""  # separate control listener (empty: same listener as clients)
    port: int = Field(default=0, ge=0, le=65535)


class HASettings(_Frozen):
    """Lease settings (our extension, ``ha`` key); CLI flags override them."""

    lease_path: str = ""
    etcd_endpoints: str = ""
    etcd_prefix: str = ""
    etcd_cacert: str = Field(
        default="", description="PEM CA bundle for `https://` etcd endpoints (`--etcd-cacert`)"
    )
    etcd_cert: str = Field(
        default="", description="PEM TLS client certificate for etcd, with `etcd_key` (`--etcd-cert`)"
    )
    etcd_key: str = Field(default="", description="key of `etcd_cert` (`--etcd-key`)")
    etcd_user: str = Field(
        default="", description="etcd user: authenticated at `/v3/auth/authenticate` (`--etcd-user`)"
    )
    etcd_password_env: str = Field(
        default="", description="environment variable holding `etcd_user`'s password (`--etcd-password-env`)"
    )
    router_id: str = ""
    lease_ttl_s: float = Field(default=5.0, gt=0)
    lease_renew_interval_s: float = Field(default=1.0, gt=0)
    lease_safety_margin_s: float = Field(default=1.0, ge=0)
    standby_probe_interval_s: float = Field(default=0.25, gt=0)
    standby_takeover_after: int = Field(default=4, ge=1)
    standby_max_handoff_age_s: float = Field(default=30.0, gt=0)
    # active-active serving (router/replicas; docs/ha.md)
    mode: Literal["active-passive", "active-active"] = Field(
        default="active-passive",
        description="`active-passive` (Narwhal 0.7.0: one serving router, a warm standby) or "
        "`active-active` (every replica serves, the lease holder controls; needs the etcd backend) "
        "(`--ha-mode`).",
    )
    replica_ttl_s: float = Field(
        default=2.0,
        ge=2,
        description="Active-active: TTL of each replica's membership key (whole seconds, >= 2). A "
        "killed replica stops counting for drains and `ready_to_stop` this long after its last "
        "renewal (`--replica-ttl`).",
    )
    replica_safety_margin_s: float = Field(
        default=0.5,
        ge=0,
        description="Active-active: a replica that cannot renew its key stops placing this long "
        "before the key can expire (`--replica-safety-margin`).",
    )
    replica_ack_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="Active-active: how long a drain waits for every live replica to apply it "
        "before answering 503 (the hold stays; repeating the drain is the retry).",
    )
    advertise_url: str = Field(
        default="",
        description="Active-active: this replica's control URL as others reach it (`--advertise-url`; "
        "default `http://<control host or host>:<control port or port>`).",
    )

    @model_validator(mode="after")
    def _check(self) -> HASettings:
        check_lease_timing(self.lease_ttl_s, self.lease_renew_interval_s, self.lease_safety_margin_s)
        check_replica_timing(self.replica_ttl_s, self.replica_safety_margin_s, self.replica_ack_timeout_s)
        return self


def check_replica_timing(ttl: float, margin: float, ack_timeout: float) -> None:
    for name, v in (
        ("replica_ttl", ttl),
        ("replica_safety_margin", margin),
        ("replica_ack_timeout", ack_timeout),
    ):
        if not math.isfinite(v):
            raise ValueError(f"{name} must be finite")
    if ttl < 2 or ttl != int(ttl):
        raise ValueError("replica_ttl must be a whole number of seconds >= 2 (an etcd lease TTL)")
    if margin < 0 or margin >= ttl / 2:
        raise ValueError("replica_safety_margin must be >= 0 and < replica_ttl / 2")
    if ack_timeout <= 0:
        raise ValueError("replica_ack_timeout must be positive")


def check_lease_timing(ttl: float, renew: float, margin: float) -> None:
    for name, v in (("lease_ttl", ttl), ("lease_renew_interval", renew), ("lease_safety_margin", margin)):
        if not math.isfinite(v):
            raise ValueError(f"{name} must be finite")
    if renew <= 0:
        raise ValueError("lease_renew_interval must be positive")
    if margin < 0 or margin >= ttl:
        raise ValueError("lease_safety_margin must be >= 0 and < lease_ttl")
    if ttl <= renew + margin:
        raise ValueError("lease_ttl must exceed lease_renew_interval + lease_safety_margin")


class FleetConfig(_Frozen):
    schema_: Literal["narwhal.fleet"] = Field(default="narwhal.fleet", alias="schema")
    schema_version: Literal[2] = 2
    model: str = Field(min_length=1)
    engines: tuple[EngineSpec, ...] = Field(min_length=1)
    engine_contract: dict[str, Any] | None = None
    engine: EngineSettings = EngineSettings()
    serving: ServingSettings = ServingSettings()
    recovery: RecoverySettings = RecoverySettings()
    controller: ControllerSettings = ControllerSettings()
    control: ControlSettings = ControlSettings()
    ha: HASettings = HASettings()
    slo: SLOSettings | None = None
    profiles: dict[str, Any] | None = None  # accepted, unused
    hardware: dict[str, Any] | None = None  # 0.7.0's engine shape: accepted, unused

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, allow_inf_nan=False)

    @field_validator("profiles", "hardware")
    @classmethod
    def _peer_objects(cls, v: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        return check_peer_object(str(info.field_name), v)

    @field_validator("engine_contract", mode="before")
    @classmethod
    def _legacy_contract_names(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        out: dict[str, Any] = {}
        for key, value in v.items():
            name = LEGACY_CONTRACT_NAMES.get(key, key)
            if name not in CONTRACT_FIELDS:
                raise ValueError(f"unknown key engine_contract.{key}")
            out[name] = value
        return out

    @model_validator(mode="after")
    def _check_fleet(self) -> FleetConfig:
        ids = [e.iid for e in self.engines]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"duplicate engine iid(s): {', '.join(dupes)}")
        if self.recovery.engine_restart_policy == "whole_wave":
            if not self.contract_complete:
                raise ValueError("engine_restart_policy whole_wave requires a complete engine_contract")
            if self.recovery.liveness_every <= 0:
                raise ValueError("engine_restart_policy whole_wave requires recovery.liveness_every > 0")
        ctl = self.controller
        for role, floor in (("prefill", ctl.min_prefill), ("decode", ctl.min_decode)):
            able = sum(1 for e in self.engines if e.role == role or not e.pin)
            if floor > able:
                raise ValueError(
                    f"controller.min_{role} = {floor} exceeds the {able} configured engine(s) able to "
                    f"serve {role}"
                )
        return self

    @property
    def contract_complete(self) -> bool:
        c = self.engine_contract
        return c is not None and all(f in c for f in CONTRACT_FIELDS)

    @property
    def engine_ids(self) -> list[str]:
        return sorted(e.iid for e in self.engines)

    def engine_by_id(self, iid: str) -> EngineSpec:
        for e in self.engines:
            if e.iid == iid:
                return e
        raise KeyError(iid)

    def unused_keys(self) -> list[str]:
        """Keys set in the file that this router accepts but does not act on (``config_keys``)."""
        from router.config_keys import unused_settings

        return [key for key, _ in unused_settings(self)]


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def drop_comments(data: Any) -> Any:
    """The document without ``_``-prefixed keys at any depth (0.7.0's comment convention)."""
    if isinstance(data, dict):
        return {
            k: drop_comments(v) for k, v in data.items() if not (isinstance(k, str) and k.startswith("_"))
        }
    if isinstance(data, list):
        return [drop_comments(v) for v in data]
    return data


def parse_fleet(data: Any, source: str = "<fleet>") -> FleetConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: fleet file must be a JSON/YAML object")
    try:
        return FleetConfig.model_validate(drop_comments(data))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = _loc(tuple(err["loc"]))
        if err["type"] == "extra_forbidden":
            raise ConfigError(f"{source}: unknown key '{where}'") from None
        msg = str(err["msg"]).removeprefix("Value error, ")
        if msg.startswith("unknown key "):
            raise ConfigError(f"{source}: {msg.replace('unknown key ', 'unknown key ', 1)}") from None
        raise ConfigError(f"{source}: {where or 'fleet'}: {msg}") from None


def load_fleet(path: str | Path) -> FleetConfig:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read fleet file: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text) if p.suffix in (".yaml", ".yml") else json.loads(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(
            f"{p}: not valid {'YAML' if p.suffix in ('.yaml', '.yml') else 'JSON'}: {exc}"
        ) from None
    return parse_fleet(data, str(p))
