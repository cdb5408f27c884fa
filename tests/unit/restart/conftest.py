"""Time-skipping Temporal environment (Java test server, offline) for the restart workflow tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from temporalio.testing import WorkflowEnvironment

from tests.support.temporal import dying_with_us, start_time_skipping, time_skipping_server_path


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def ts_env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[WorkflowEnvironment]:
    server = dying_with_us(time_skipping_server_path(), tmp_path_factory.mktemp("temporal"))
    env = await start_time_skipping(server)
    try:
        yield env
    finally:
        await env.shutdown()
