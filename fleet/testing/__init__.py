"""Test-and-bench support shared by ``tests/`` and ``bench/``: real processes on free loopback
ports (``procs``), router and fleet helpers (``router``, ``fleet``), the packaged Temporal binaries
(``temporal``), and Prometheus samples (``metrics``). ``tests/support/*`` re-exports these modules.
"""
