"""Test-and-bench support shared by ``tests/`` and ``bench/``: real processes on free loopback
ports (``procs``), router and fleet helpers (``router``, ``fleet``), the packaged Temporal binaries
(``temporal``), Prometheus samples (``metrics``), a real etcd cluster (``etcd``), attestation
sidecars (``attest``), a cuttable TCP proxy (``tcp_proxy``), small filesystems (``smallfs``),
one-shot loopback HTTP calls without a TLS context per call (``loopback``). ``tests/support/*`` re-exports these modules.

Not shipped: the wheel (``[tool.setuptools.packages.find]`` in pyproject.toml) and the images
(Dockerfile, .dockerignore) leave it out, so nothing in router/, workflows/, activities/ or fleet/
may import it (tests/integration/test_packaging.py). Importable from the source tree: pytest (rootdir),
``bench/`` and ``scripts/`` put the repository on ``sys.path``.
"""
