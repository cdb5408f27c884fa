"""Console-script logging: per-request client lines (a standby's polls) appear only at debug."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from router.logs import CLIENT_LOGGERS, quiet_clients


@pytest.fixture(autouse=True)
def _restore_levels() -> Iterator[None]:
    before = {name: logging.getLogger(name).level for name in CLIENT_LOGGERS}
    yield
    for name, level in before.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.parametrize("level", [logging.INFO, logging.WARNING])
def test_client_request_lines_are_hidden_above_debug(level: int) -> None:
    quiet_clients(level)
    for name in CLIENT_LOGGERS:
        assert not logging.getLogger(name).isEnabledFor(logging.INFO)
        assert logging.getLogger(name).isEnabledFor(logging.WARNING)


def test_client_request_lines_show_at_debug() -> None:
    quiet_clients(logging.DEBUG)
    assert logging.getLogger("httpx").isEnabledFor(logging.DEBUG)
