"""Suite-wide pytest hooks (kept in fleet/testing so they can be loaded outside this tree too)."""

from fleet.testing.xdist import pytest_configure

__all__ = ["pytest_configure"]
