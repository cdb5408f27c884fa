"""pytest plugin: every pytest-xdist worker dies with the pytest process that started it.

A test's processes die with the process that started them (``PR_SET_PDEATHSIG``, ``fleet/procs.py``);
under xdist that process is a worker, so the worker itself must not outlive a SIGKILLed pytest —
otherwise it runs its test to the end and the processes it started run on as orphans.
``tests/conftest.py`` loads it; ``-p narwhal_testing.xdist`` loads it anywhere else.
"""

from __future__ import annotations

import os

import pytest

from fleet.procs import die_with_parent


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    parent = os.getppid()
    die_with_parent()
    if os.getppid() != parent:  # pytest died before the request reached the kernel
        os._exit(1)
