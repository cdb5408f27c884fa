"""Suite-wide pytest hooks: xdist workers die with pytest (kept in narwhal_testing so they can be
loaded outside this tree too), and the project is byte-compiled once before any test runs.

The suite starts a few hundred Python processes (routers, engines, supervisors, workers, CLIs).
Where bytecode is not written on import (``PYTHONDONTWRITEBYTECODE``, as on some CI images), each of
them compiled the project's modules again; compiled once here, they load bytecode (an up-to-date
tree costs a stat per module).
"""

from __future__ import annotations

import compileall
import os

import pytest

from narwhal_testing import xdist
from narwhal_testing.procs import REPO

__all__ = ["pytest_configure"]

PACKAGES = ("router", "fleet", "workflows", "activities", "narwhal_models", "narwhal_testing")


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller (or a run without xdist)
        for package in PACKAGES:
            compileall.compile_dir(REPO / package, quiet=2)
    xdist.pytest_configure(config)
