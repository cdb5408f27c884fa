"""What the router does with every fleet-file key: the registry the configuration tests read.

Every key of the configuration model (``router/config.py``) is in exactly one of:

* ``USED`` — key → the module that acts on it (a test checks the module mentions the key's name);
* ``UNUSED`` — key → why it is accepted without effect. Such keys are listed once at start-up as
  "accepted, not used" when the fleet file sets them, and marked so in ``docs/configuration.md``
  (``scripts/gen_config_docs.py`` reads this registry).

No section accepts keys it does not name (``router/config.py``): a key outside both lists is refused
at start-up (``narwhal-serve`` exits 2 naming the key and the file). ``PEER_COMPAT`` is the explicit
list of keys accepted only because Narwhal 0.7.0 accepts them (its fleet files must start unchanged);
each is in ``UNUSED``. Adding a key to ``router/config.py`` means adding one line here; ``tests/unit/test_config_keys.py``
walks the model and fails for a key that is in neither (or in both). Moving a key from ``UNUSED`` to
``USED`` is the last step of implementing it.

``ALWAYS_ZERO_COUNTERS`` are handoff/state counters kept for wire compatibility with Narwhal 0.7.0
that this router never increments; they are not exported in ``/metrics`` and are named in the
start-up line too.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

USED: dict[str, str] = {
    "schema": "router/config.py",
    "schema_version": "router/config.py",
    "model": "router/serving/handler.py",
    "engines[].iid": "router/scheduler.py",
    "engines[].url": "router/scheduler.py",
    "engines[].role": "router/scheduler.py",
    "engines[].pin": "router/scheduler.py",
    "engines[].attestation_url": "router/engines/control.py",
    "engine_contract": "router/lifecycle/readmission.py",
    "engine.backend": "router/config.py",  # only "vllm" is accepted: the one implemented backend
    "engine.connector": "router/config.py",  # only "nixl"
    "engine.dialect": "router/config.py",  # only "vllm"
    "engine.health_timeout_s": "router/engines/control.py",
    "engine.first_token_timeout_s": "router/serving/handler.py",
    "engine.decode_read_timeout_s": "router/engines/legs.py",
    "engine.engine_api_key_env": "router/engines/legs.py",
    "serving.request_timeout_s": "router/serving/handler.py",
    "serving.prefill_timeout_s": "router/engines/legs.py",
    "serving.max_connections": "router/serving/handler.py",
    "serving.max_attempts": "router/serving/handler.py",
    "serving.queue_capacity": "router/serving/handler.py",
    "serving.queue_timeout_s": "router/serving/handler.py",
    "serving.max_request_bytes": "router/serving/handler.py",
    "serving.max_response_bytes": "router/engines/legs.py",
    "serving.client_write_timeout_s": "router/serving/handler.py",
    "slo": "router/serving/outcome.py",
    "serving.graceful_timeout_s": "router/settings.py",
    "serving.max_tokens_limit": "router/context_limits.py",
    "serving.max_client_connections": "router/connections.py",
    "serving.header_timeout_s": "router/connections.py",
    "serving.idle_timeout_s": "router/connections.py",
    "serving.fd_reserve": "router/connections.py",
    "recovery.state_path": "router/ha/settings.py",
    "recovery.resume": "router/ha/settings.py",
    "recovery.engine_restart_policy": "router/lifecycle/machine.py",
    "recovery.eject_after": "router/assemble.py",
    "recovery.readmit_every": "router/probes.py",
    "recovery.liveness_every": "router/lifecycle/monitor.py",
    "recovery.liveness_misses": "router/lifecycle/monitor.py",
    "recovery.failure_quarantine_s": "router/assemble.py",
    "controller.monitor_interval_s": "router/lifecycle/monitor.py",
    "controller.monitor_failure_limit": "router/lifecycle/monitor.py",
    "controller.min_prefill": "router/core.py",
    "controller.min_decode": "router/core.py",
    "control.token_env": "router/lifecycle/auth.py",
    "control.protect_reads": "router/lifecycle/auth.py",
    "control.host": "router/listeners.py",
    "control.port": "router/listeners.py",
    "ha.lease_path": "router/ha/settings.py",
    "ha.etcd_endpoints": "router/ha/settings.py",
    "ha.etcd_prefix": "router/ha/settings.py",
    "ha.etcd_cacert": "router/ha/settings.py",
    "ha.etcd_cert": "router/ha/settings.py",
    "ha.etcd_key": "router/ha/settings.py",
    "ha.etcd_user": "router/ha/settings.py",
    "ha.etcd_password_env": "router/ha/settings.py",
    "ha.router_id": "router/ha/settings.py",
    "ha.lease_ttl_s": "router/ha/settings.py",
    "ha.lease_renew_interval_s": "router/ha/settings.py",
    "ha.lease_safety_margin_s": "router/ha/settings.py",
    "ha.standby_probe_interval_s": "router/ha/settings.py",
    "ha.standby_takeover_after": "router/ha/settings.py",
    "ha.standby_max_handoff_age_s": "router/ha/settings.py",
    "ha.mode": "router/replicas/settings.py",
    "ha.replica_ttl_s": "router/replicas/settings.py",
    "ha.replica_safety_margin_s": "router/replicas/settings.py",
    "ha.replica_ack_timeout_s": "router/replicas/settings.py",
    "ha.advertise_url": "router/replicas/settings.py",
}

_ROLE_CONTROLLER = "the role controller of Narwhal 0.7.0 is not implemented (roles stay as configured)"
_RETRY = "retry tuning of Narwhal 0.7.0 is not implemented; serving.max_attempts bounds the attempts"

UNUSED: dict[str, str] = {
    "engines[].shared_device": "device sharing is not modelled: placement and the breaker treat "
    "every engine as its own device",
    "engine.tokenize": "exact prompt sizing via /tokenize is not implemented",
    "engine.chars_per_token": "prompt size estimation is not implemented",
    "engine.tokenize_timeout_s": "exact prompt sizing via /tokenize is not implemented",
    "engine.control_connections": "engine control calls use their own fixed pool (router/engines/control.py)",
    "engine.pool_timeout_s": "legs never wait for a pool slot: a leg without an idle connection opens one",
    "engine.connect_timeout_s": "engine connects are bounded by engine.health_timeout_s",
    "engine.first_token_calibration_path": "first-token calibration is not implemented",
    "serving.admission": "predictive admission is not implemented",
    "serving.admission_margin": "predictive admission is not implemented",
    "serving.retry_base_s": _RETRY,
    "serving.retry_cap_s": _RETRY,
    "serving.retry_budget": _RETRY,
    "serving.retry_replenish": _RETRY,
    "recovery.health": "drift ejection is not implemented",
    "controller.advisory": _ROLE_CONTROLLER,
    "controller.flip_history": _ROLE_CONTROLLER,
    "controller.thresholds": _ROLE_CONTROLLER,
    "controller.reactive": _ROLE_CONTROLLER,
    "profiles": "engine profiling is not implemented; profiles.path only places the default journal",
    "hardware": "the engine hardware shape only feeds Narwhal 0.7.0's profiling, not implemented",
}

# Keys accepted only for compatibility with Narwhal 0.7.0 fleet files (each also in UNUSED).
PEER_COMPAT: tuple[str, ...] = tuple(UNUSED)

ALWAYS_ZERO_COUNTERS: dict[str, str] = {
    "unserved": "no SLO-aware placement",
    "unsized_offered": "no request sizing",
}


def _walk_set(model: BaseModel, prefix: str, out: dict[str, str]) -> None:
    fields = type(model).model_fields
    for name in sorted(n for n in model.model_fields_set if n in fields):
        field = fields[name]
        key = f"{prefix}{field.alias or name}"
        value = getattr(model, name)
        if key in UNUSED:
            if value is not None:
                out.setdefault(key, UNUSED[key])
        elif isinstance(value, BaseModel):
            _walk_set(value, f"{key}.", out)
        elif isinstance(value, tuple) and value and all(isinstance(v, BaseModel) for v in value):
            for item in value:
                _walk_set(item, f"{key}[].", out)


def unused_settings(config: Any) -> list[tuple[str, str]]:
    """(key, reason) for every key the fleet file sets that the router accepts without effect."""
    out: dict[str, str] = {}
    _walk_set(config, "", out)
    return sorted(out.items())


def startup_report(config: Any) -> str:
    """The one start-up line naming what is accepted but not used ("" when nothing is)."""
    parts = [f"{key} ({reason})" for key, reason in unused_settings(config)]
    counters = ", ".join(f"{name} ({why})" for name, why in ALWAYS_ZERO_COUNTERS.items())
    line = f"accepted, not used: {'; '.join(parts)}" if parts else ""
    return f"{line}{'. ' if line else ''}counters not implemented (always 0, not in /metrics): {counters}"
