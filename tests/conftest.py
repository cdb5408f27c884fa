"""Suite-wide pytest hooks: xdist workers die with pytest (``fleet/testing/xdist.py``), and the
longest integration files are collected first.

``scripts/test.sh`` hands whole files to two xdist workers in collection order
(``--dist loadfile --no-loadscope-reorder``): longest first, then the other integration files,
then the unit tests, so that both workers finish at about the same time instead of one running a
long file alone at the end. The list is an ordering hint only (from ``--durations``); a file not
in it just runs in its usual place.
"""

from __future__ import annotations

import pytest

from fleet.testing.xdist import pytest_configure

__all__ = ["pytest_collection_modifyitems", "pytest_configure"]

LONGEST_FIRST = (
    "test_restart_workflows.py",
    "test_narwhal_up.py",
    "test_ha_failover.py",
    "test_restart_operator.py",
    "test_ha_etcd.py",
    "test_active_active.py",
    "test_chaos.py",
    "test_restart_exactly_once.py",
    "test_narwhal_up_replicas.py",
    "test_lifecycle_individual.py",
    "test_ha_faults.py",
    "test_stream_limits.py",
    "test_ha_etcd_faults.py",
    "test_lifecycle_wave.py",
)


def _rank(item: pytest.Item) -> int:
    path = item.path
    if path.parent.name != "integration":
        return len(LONGEST_FIRST) + 1
    try:
        return LONGEST_FIRST.index(path.name)
    except ValueError:
        return len(LONGEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: the order inside each file and group is kept
