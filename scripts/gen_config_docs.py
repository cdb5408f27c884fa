#!/usr/bin/env python3
"""Generate docs/configuration.md from the fleet-file models in router/config.py.

    .venv/bin/python scripts/gen_config_docs.py           # rewrite docs/configuration.md
    .venv/bin/python scripts/gen_config_docs.py --check   # exit 1 if the committed file is stale

Types, defaults and constraints come from the pydantic models; descriptions come from
``Field(description=...)`` when a model sets one, else from ``DESCRIPTIONS`` below. A key without a
description is an error, so a new key cannot reach the reference undocumented
(tests/unit/test_config_docs.py runs this generator).
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from router import config, config_keys  # noqa: E402

OUTPUT = REPO / "docs" / "configuration.md"

# Keyed by dotted path; ``engines[]`` is the per-engine object.
DESCRIPTIONS: dict[str, str] = {
    "schema": "Document type; must be `narwhal.fleet`.",
    "schema_version": "Fleet file version; this router reads version 2 only.",
    "model": "Served model ID. Clients must ask for it (else 404 `model_not_found`); readmission "
    "checks that every engine lists it in `/v1/models`.",
    "engines": "The configured engine set (at least one). Engine IDs must be unique; the HA handoff "
    "document must name exactly this set.",
    "engine_contract": "Engine build/launch contract that attestation documents must match exactly. "
    "Required (complete: every field below) for the lifecycle API (drain/readmit) and for "
    "`recovery.engine_restart_policy: whole_wave`.",
    "engine": "Engine backend, dialect and timeouts.",
    "serving": "Client-facing limits and timeouts.",
    "recovery": "Handoff state file, breaker and automatic recovery.",
    "controller": "Background monitor loop and role floors.",
    "control": "Control-plane security and listener (Narwhal extension).",
    "ha": "Lease and warm-standby settings (Narwhal extension); `narwhal-serve` flags override them.",
    "slo": "Service-level objectives `{ttft_s, tpot_s}` (both required, seconds, > 0): a served "
    "request with TTFT (arrival to first token) ≤ `ttft_s` and time per output token (first token "
    "to the end, per later token) ≤ `tpot_s` counts in `slo_met` (`narwhal_slo_met_total`); absent: "
    "`slo_met` stays 0. Placement does not use it.",
    "profiles": "Engine profiles of Narwhal 0.7.0 (`path`, `max_decode_fit_mape`, `max_decode_cv_mape`; "
    "other sub-keys are errors).",
    "hardware": "Engine hardware shape of Narwhal 0.7.0 (`accelerator`, `accelerators_per_engine`, "
    "`tensor_parallel`; other sub-keys are errors).",
    # engines[]
    "engines[].iid": "Engine ID used in the lifecycle API, metrics, journal and restart commands: "
    "`[A-Za-z0-9._-]{1,64}`, anything else is refused naming the value.",
    "engines[].url": "Engine base URL (OpenAI-compatible vLLM server); a trailing `/` is removed. "
    "`http`/`https` with a host, optional port and plain path only (no credentials, query, spaces "
    "or shell metacharacters).",
    "engines[].role": "Initial PD role: the leg the router prefers to place on this engine.",
    "engines[].pin": "Keep the configured role fixed (no role flips; kept across `--resume`); "
    "fabric validation pairs respect the pin.",
    "engines[].attestation_url": "URL of the engine's `narwhal.attestation` document (attestation "
    "sidecar). Empty: readmission fails with `attestation_url is not configured`.",
    "engines[].shared_device": "Label of a device this engine shares with other engines, or Narwhal "
    "0.7.0's allocation object (`group`, `gpu_uuid`, `device_allowance`, `gpu_memory_utilization`; "
    "other sub-keys are errors).",
    # engine
    "engine.backend": "Engine backend. Only vLLM is implemented.",
    "engine.connector": "KV transfer connector. Only NIXL (descriptor hand-off) is implemented.",
    "engine.dialect": "Request dialect spoken to engines.",
    "engine.health_timeout_s": "Timeout of health, identity (`/version`, `/metrics`) and attestation reads.",
    "engine.first_token_timeout_s": "Decode leg: the first streamed token must arrive within this "
    "time; a buffered leg's answer within this plus `(max_tokens - 1) × decode_read_timeout_s` "
    "(`docs/api.md`); also bounds the fabric check.",
    "engine.decode_read_timeout_s": "Decode leg: largest allowed gap between streamed chunks, and "
    "between the body bytes of a buffered answer.",
    "engine.engine_api_key_env": "Name of an environment variable holding the engines' API key; when "
    "set, engine requests carry `authorization: Bearer <key>`.",
    "engine.tokenize": "Size prompts exactly via the engine's `/tokenize`.",
    "engine.chars_per_token": "Narwhal 0.7.0: characters per token of its prompt-size estimate.",
    "engine.tokenize_timeout_s": "Narwhal 0.7.0: timeout of `/tokenize` calls.",
    "engine.control_connections": "Narwhal 0.7.0: connection pool size of engine control calls.",
    "engine.pool_timeout_s": "Narwhal 0.7.0: how long a leg waits for a connection of the engine pool.",
    "engine.connect_timeout_s": "Narwhal 0.7.0: engine connect timeout.",
    "engine.first_token_calibration_path": "Narwhal 0.7.0: first-token calibration artifact.",
    # serving
    "serving.request_timeout_s": "Overall deadline of one client request.",
    "serving.prefill_timeout_s": "Timeout of the prefill leg and of the readmission generation check.",
    "serving.max_connections": "In-flight request seats (admission limit; `--max-concurrent` "
    "overrides it) and the engine connection pool size: the router keeps at most this many "
    "connections to engines open; a leg that finds no idle connection opens one (it never waits), "
    "and a connection returned while this many are open is closed instead of kept alive.",
    "serving.queue_capacity": "Requests allowed to wait (first in, first out) for a seat when all are "
    "taken; past it, and with 0, 429 `inflight_limit` at once (counted `rejected`). Gauge "
    "`narwhal_queued_requests`.",
    "serving.queue_timeout_s": "Longest wait in the admission queue before 504 `queue_expired` "
    "(counted `expired`, reason `queue_timeout`); 0 = bounded by `serving.request_timeout_s` only.",
    "serving.max_attempts": "Full prefill+decode attempts per request; never retried after output started.",
    "serving.max_request_bytes": "Largest accepted request body (413 `request_too_large` above; the "
    "refused body is still read, for up to 10 s, so the client sees the answer, then the connection "
    "closes).",
    "serving.max_response_bytes": "Largest engine response (body bytes of one leg) the router "
    "takes; past it the request fails with reason `response_limit`: 502 before any output reached "
    "the client, an error event on a started stream. Never retried, no breaker evidence.",
    "serving.client_write_timeout_s": "How long a streaming client may leave the router's writes "
    "unread (its connection over the write high-water mark) before the stream is cut: counted "
    "`cancelled` with reason `slow_client` in the journal, the engine's decode leg is closed.",
    "serving.max_client_connections": "Most client connections the router holds open at once; one "
    "more is accepted and closed at once (`narwhal_connections_refused_total`). The effective bound "
    "is also at most half of the descriptors `RLIMIT_NOFILE` leaves after `fd_reserve` (logged at "
    "start-up, `narwhal_client_connection_bound`); the control listener may take 32 more.",
    "serving.header_timeout_s": "A new connection that has not sent a complete request head within "
    "this many seconds is closed (`narwhal_header_timeouts_total`).",
    "serving.idle_timeout_s": "A connection with no request in progress (idle keep-alive, headers "
    "that never complete, or a completion request's body that stopped arriving for this long) is "
    "closed after this many seconds. Requests in progress are bounded by `request_timeout_s` instead.",
    "serving.fd_reserve": "File descriptors kept free for the control plane's own files and sockets "
    "(lease renewal, state-file writes, engine control calls): client connections never take them.",
    "serving.max_tokens_limit": "Largest `max_tokens` / `max_completion_tokens` a request may ask for: "
    "above it (or above the smallest `max_model_len` the engines report in `/v1/models`) the request "
    "is a 400 `context_length_exceeded` that touches no engine. Unset: only the reported context "
    "bounds it.",
    "serving.graceful_timeout_s": "On SIGTERM: how long in-flight requests may finish before the "
    "listener closes.",
    "serving.admission": "Admission mode of Narwhal 0.7.0 (`predictive`).",
    "serving.admission_margin": "Narwhal 0.7.0: predictive admission margin.",
    "serving.retry_base_s": "Narwhal 0.7.0: first retry backoff.",
    "serving.retry_cap_s": "Narwhal 0.7.0: largest retry backoff.",
    "serving.retry_budget": "Narwhal 0.7.0: shared retry budget.",
    "serving.retry_replenish": "Narwhal 0.7.0: retry budget replenished per request.",
    # recovery
    "recovery.state_path": "Handoff state file, written atomically by the active router and read "
    "by `--resume`.",
    "recovery.resume": "Same as `narwhal-serve --resume`: restore the handoff state at start.",
    "recovery.engine_restart_policy": "`individual`: engines are drained, restarted and readmitted "
    "one at a time. `whole_wave`: any ejection holds the whole fleet and only a whole-wave "
    "drain/readmit releases it (needs a complete `engine_contract` and `liveness_every > 0`).",
    "recovery.eject_after": "Consecutive failures that eject an engine (breaker).",
    "recovery.readmit_every": "Monitor intervals between automatic recovery probes of ejected engines.",
    "recovery.liveness_every": "Monitor intervals between liveness + process-identity sweeps (0 disables).",
    "recovery.liveness_misses": "Consecutive missed liveness probes that eject an engine.",
    "recovery.failure_quarantine_s": "Timed hold after any leg failure: the engine takes no new "
    "placement for this long (0: off); a later failure extends it. Never applied to an engine "
    "the role floors cannot spare (`controller.min_prefill`/`min_decode`). Shown in `/narwhal/state` "
    "(`scheduler.engines.<id>.quarantine`) and as `accepts_new: false` in the lifecycle document.",
    "recovery.health": "Drift-ejection settings of Narwhal 0.7.0 (`window_s`, `drift_band`, "
    "`min_samples`, `probation_windows`, `evict_windows`, `recovery_windows`, `probation_penalty_s`, "
    "`relative_band`; other sub-keys are errors).",
    # controller
    "controller.monitor_interval_s": "Cadence of the monitor loop (liveness, recovery, handoff writes: a pass writes the state file when it changed, and at least every 5 s while only the counters moved; docs/ha.md).",
    "controller.monitor_failure_limit": "Consecutive monitor passes with a failing stage (identity, "
    "liveness, readmission, handoff write) before the router is `monitoring degraded: <stage> "
    "<Class>` (`/ready` 503, new prefill placement refused) until a clean pass.",
    "controller.min_prefill": "Role floor: fewest placement-eligible engines able to serve prefill "
    "(labelled prefill, or unpinned). A single-engine drain that would go below it is refused "
    "(409 naming the role) and the breaker spares (never ejects, holds or quarantines) an engine "
    "the floor needs. 0 disables the floor. Must not exceed the engines able to serve the role.",
    "controller.min_decode": "Role floor for decode; same rules as `controller.min_prefill`.",
    "controller.advisory": "Narwhal 0.7.0: role controller decides without acting.",
    "controller.flip_history": "Narwhal 0.7.0: role flips kept in its history.",
    "controller.thresholds": "Narwhal 0.7.0: role-controller thresholds (`expand`, `shrink`, "
    "`cooldown_s`, `sustained_intervals`, `dwell_s`, `panic_ratio`, `flip_resident_guard`; other "
    "sub-keys are errors).",
    "controller.reactive": "Narwhal 0.7.0: reactive role-controller settings (its `reactive_*` "
    "settings without the prefix, e.g. `window_s`, `confirmations`, `utilization`; other sub-keys "
    "are errors).",
    # control
    "control.token_env": "Name of an environment variable holding a bearer token required for "
    "`/narwhal/*` mutations (empty: no token).",
    "control.protect_reads": "Also require the token for `/narwhal/*` reads.",
    "control.host": "Control listener host (`--control-host`; empty: the client `--host`). Used only "
    "with `control.port`.",
    "control.port": "Control listener port (`--control-port`; 0: none, every route on the client "
    "listener). When set, `/narwhal/*` is served only there (404 on the client listener), together "
    "with `/health`, `/ready` and `/metrics`; completions and `/v1/*` stay on the client listener. "
    "Must differ from the client `--port`.",
    # ha
    "ha.lease_path": "Lease file shared by the router pair (`--lease-path`); empty disables fencing "
    "unless `ha.etcd_endpoints` is set. Not together with `ha.etcd_endpoints` (exit 2).",
    "ha.etcd_endpoints": "Comma-separated etcd client URLs `http://host:port` (`--etcd-endpoints`): "
    "the lease (holder key on an etcd lease), the epoch counter and the fenced handoff live in etcd "
    "(docs/ha.md). Empty: the file lease (`ha.lease_path`) or none.",
    "ha.etcd_prefix": "Key prefix in etcd (`--etcd-prefix`; empty: `/narwhal/<model>/`). Must start "
    "and end with `/`; one prefix per fleet.",
    "ha.router_id": "Router ID in the lease holder token (`--router-id`; default `<hostname>:<port>`).",
    "ha.lease_ttl_s": "Lease lifetime (`--lease-ttl`); must exceed renew interval + safety margin.",
    "ha.lease_renew_interval_s": "Lease renewal cadence (`--lease-renew-interval`).",
    "ha.lease_safety_margin_s": "Local validity ends this long before the lease expires "
    "(`--lease-safety-margin`); covers clock offset between routers.",
    "ha.standby_probe_interval_s": "Standby: cadence of primary probes (`--standby-probe-interval`).",
    "ha.standby_takeover_after": "Standby: failed probes before it tries to take the lease "
    "(`--standby-takeover-after`).",
    "ha.standby_max_handoff_age_s": "Standby: oldest primary handoff snapshot it will apply at "
    "takeover (`--standby-max-handoff-age`).",
}

CONTRACT_DESCRIPTIONS: dict[str, str] = {
    "engine_version": "Engine version (`GET /version`).",
    "image_digest": "Container image digest of the engine build.",
    "transfer_version": "KV transfer library version (NIXL).",
    "connector_version": "KV connector version.",
    "model_architecture": "Model architecture class.",
    "model_dtype": "Model weights dtype.",
    "kv_heads": "Number of KV heads.",
    "head_size": "Attention head size.",
    "hidden_layers": "Number of hidden layers.",
    "attention_backend": "Attention backend.",
    "kv_cache_dtype": "KV cache dtype.",
    "cross_layers_blocks": "Cross-layer KV blocks enabled.",
    "hybrid_kv_cache_manager": "Hybrid KV cache manager enabled.",
    "connector": "KV connector class (e.g. `NixlConnector`).",
    "kv_role": "KV role of the engine (e.g. `kv_both`).",
    "transfer_mode": "KV transfer mode (e.g. `pull`).",
    "speculative_config": "Speculative decoding configuration.",
    "enforce_handshake_compat": "Whether the connector enforces handshake compatibility.",
}

SECTION_NOTES: dict[str, str] = {
    "ha": "Lease timing must be finite with `lease_renew_interval_s > 0`, "
    "`0 ≤ lease_safety_margin_s < lease_ttl_s` and "
    "`lease_ttl_s > lease_renew_interval_s + lease_safety_margin_s`.",
}


class MissingDescription(KeyError):
    pass


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    args = get_args(tp)
    if origin is Literal:
        return " \\| ".join(f"`{json.dumps(a)}`" for a in args)
    if origin in (Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return "object"
    if tp is type(None):
        return "null"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "object"
    if tp is typing.Any:
        return "any"
    if isinstance(tp, type):
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(
            tp.__name__, tp.__name__
        )
    return str(tp)


def _constraints(field: FieldInfo) -> str:
    parts: list[str] = []
    for m in field.metadata:
        if isinstance(m, annotated_types.Gt):
            parts.append(f"> {m.gt}")
        elif isinstance(m, annotated_types.Ge):
            parts.append(f"≥ {m.ge}")
        elif isinstance(m, annotated_types.Lt):
            parts.append(f"< {m.lt}")
        elif isinstance(m, annotated_types.Le):
            parts.append(f"≤ {m.le}")
        elif isinstance(m, annotated_types.MinLen):
            parts.append("non-empty")
    return ", ".join(parts)


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        return "see below"
    text = f"`{json.dumps(value)}`"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1024 * 1024:
        text += f" ({value // (1024 * 1024)} MiB)"
    return text


def _description(path: str, field: FieldInfo) -> str:
    if field.description:
        text = field.description
    else:
        try:
            text = DESCRIPTIONS[path]
        except KeyError:
            raise MissingDescription(
                f"no description for fleet key '{path}' (add it to DESCRIPTIONS)"
            ) from None
    unused = config_keys.UNUSED.get(path)
    if unused is not None:  # router/config_keys.py: accepted without effect, reported at start-up
        text += f" **Accepted, not used:** {unused}."
    return text


def _row(key: str, type_: str, default: str, description: str) -> str:
    return f"| `{key}` | {type_} | {default} | {description} |"


def _table(model: type[BaseModel], prefix: str) -> list[str]:
    lines = ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for name, field in model.model_fields.items():
        key = field.alias or name
        path = f"{prefix}{key}"
        type_ = _type_name(field.annotation)
        constraint = _constraints(field)
        if constraint:
            type_ += f" ({constraint})"
        lines.append(_row(path, type_, _default(field), _description(path, field)))
    return lines


def _nested_sections() -> list[tuple[str, type[BaseModel], str]]:
    out: list[tuple[str, type[BaseModel], str]] = [("engines[]", config.EngineSpec, "engines[].")]
    for name, field in config.FleetConfig.model_fields.items():
        tp = field.annotation
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            out.append((name, tp, f"{name}."))
    return out


def render() -> str:
    lines = [
        "# Fleet file reference (`narwhal.fleet` v2)",
        "",
        "<!-- Generated by scripts/gen_config_docs.py from router/config.py. Do not edit by hand:",
        "     run `.venv/bin/python scripts/gen_config_docs.py`. -->",
        "",
        "`narwhal-serve --fleet PATH` reads this file (JSON, or YAML for `.yaml`/`.yml`). A Narwhal "
        "0.7.0 fleet file is accepted unchanged. Unknown keys, in every section, are errors: "
        "`narwhal-serve` exits 2 with one line naming the key and the file (e.g. `controller.min_prefil`). "
        "Keys marked **Accepted, not used** are the keys Narwhal 0.7.0 accepts that this router does "
        "not implement (the peer-compatibility list, `PEER_COMPAT` in `router/config_keys.py`): they "
        "are read and have no effect, and those the file sets are listed once at start-up (one log "
        "line, `accepted, not used: …`). Keys starting with `_` are comments (as in 0.7.0's "
        "`fleet.example.json`) and are ignored at any depth. Numbers must be finite "
        "(`NaN`/`Infinity` are errors naming the key) and within the ranges shown; a bad value "
        "makes `narwhal-serve` exit 2 with one line naming the key and the file.",
        "",
        "## Top level",
        "",
        *_table(config.FleetConfig, ""),
    ]
    for title, model, prefix in _nested_sections():
        lines += ["", f"## `{title}`", ""]
        doc = (model.__doc__ or "").strip()
        summary = DESCRIPTIONS.get(title) if title != "engines[]" else "One object per engine."
        if summary:
            lines += [summary, ""]
        elif doc:
            lines += [doc.splitlines()[0], ""]
        note = SECTION_NOTES.get(title)
        if note:
            lines += [note, ""]
        lines += _table(model, prefix)
    lines += [
        "",
        "## `engine_contract`",
        "",
        "Every field is required for a complete contract; values are compared for exact equality "
        "with the `contract` of each engine's attestation document. Legacy vLLM names are accepted: "
        + ", ".join(f"`{old}` → `{new}`" for old, new in config.LEGACY_CONTRACT_NAMES.items())
        + ". Any other key is an error.",
        "",
        "| Key | Description |",
        "| --- | --- |",
    ]
    for name in config.CONTRACT_FIELDS:
        if name not in CONTRACT_DESCRIPTIONS:
            raise MissingDescription(f"no description for engine_contract.{name}")
        lines.append(f"| `engine_contract.{name}` | {CONTRACT_DESCRIPTIONS[name]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="fail if the committed file is stale")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run scripts/gen_config_docs.py", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
