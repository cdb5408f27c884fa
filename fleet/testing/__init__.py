"""Test-and-bench support shared by ``tests/`` and ``bench/``: real processes on free loopback
ports (``procs``), router and fleet helpers (``router``, ``fleet``), the packaged Temporal binaries
(``temporal``), Prometheus samples (``metrics``), a real etcd cluster (``etcd``), attestation
sidecars (``attest``), a cuttable TCP proxy (``tcp_proxy``), small filesystems (``smallfs``),
one-shot loopback HTTP calls without a TLS context per call (``loopback``). ``tests/support/*`` re-exports these modules.
"""
