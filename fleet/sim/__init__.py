"""A vLLM-compatible simulated engine (``narwhal-engine-sim``): OpenAI API, NIXL-style PD descriptor
hand-off with a real HTTP "KV pull" between processes, Prometheus identity, attestation, and
run-time fault injection (``/sim/faults``) with observable counters (``/sim/stats``)."""
