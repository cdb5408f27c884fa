"""The engine contract every simulated engine attests and every generated fleet file pins."""

from __future__ import annotations

from typing import Any

DEFAULT_CONTRACT: dict[str, Any] = {
    "engine_version": "0.11.0",
    "image_digest": "sha256:3f1c8a5e9b7d2046c1e8f0a4b6d9c2e7a5f3b1d8c6e4a2f0b9d7c5e3a1f8b6d4",
    "transfer_version": "0.6.1",
    "connector_version": 2,
    "model_architecture": "LlamaForCausalLM",
    "model_dtype": "bfloat16",
    "kv_heads": 8,
    "head_size": 128,
    "hidden_layers": 32,
    "attention_backend": "FLASH_ATTN",
    "kv_cache_dtype": "auto",
    "cross_layers_blocks": False,
    "hybrid_kv_cache_manager": False,
    "connector": "NixlConnector",
    "kv_role": "kv_both",
    "transfer_mode": "pull",
    "speculative_config": "disabled",
    "enforce_handshake_compat": True,
}

# Where a real engine's attestation says each field came from (sidecar-style provenance).
DEFAULT_SOURCES: dict[str, str] = {
    "engine_version": "vllm.__version__",
    "image_digest": "container:image_digest",
    "transfer_version": "nixl.__version__",
    "connector_version": "NixlConnectorMetadata.version",
    "model_architecture": "config.json:architectures[0]",
    "model_dtype": "config.json:torch_dtype",
    "kv_heads": "config.json:num_key_value_heads",
    "head_size": "config.json:head_dim",
    "hidden_layers": "config.json:num_hidden_layers",
    "attention_backend": "env:VLLM_ATTENTION_BACKEND",
    "kv_cache_dtype": "arg:--kv-cache-dtype",
    "cross_layers_blocks": "arg:--kv-transfer-config",
    "hybrid_kv_cache_manager": "arg:--disable-hybrid-kv-cache-manager",
    "connector": "arg:--kv-transfer-config",
    "kv_role": "arg:--kv-transfer-config",
    "transfer_mode": "NixlConnector:pull",
    "speculative_config": "arg:--speculative-config",
    "enforce_handshake_compat": "arg:--kv-transfer-config",
}


def sources_for(contract: dict[str, Any]) -> dict[str, str]:
    """Provenance for every field of ``contract`` (known fields get their real-engine source)."""
    return {k: DEFAULT_SOURCES.get(k, f"narwhal-engine-sim:{k}") for k in contract}
