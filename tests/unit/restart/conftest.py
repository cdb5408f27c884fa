"""Time-skipping Temporal environment (Java test server, offline) for the restart workflow tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from tests.support.temporal import dying_with_us, time_skipping_server_path


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def ts_env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[WorkflowEnvironment]:
    server = dying_with_us(time_skipping_server_path(), tmp_path_factory.mktemp("temporal"))
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=server, data_converter=pydantic_data_converter
    )
    try:
        await env.client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace="default",
                search_attributes={
                    "NarwhalFleet": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
                    "NarwhalState": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
                },
            )
        )
        yield env
    finally:
        await env.shutdown()
