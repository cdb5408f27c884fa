"""Temporal through a TLS-terminating proxy (mTLS): the worker reaches it with the SDK's
``TEMPORAL_TLS_*`` settings, the CLI with flags; without them both fail with one clear line.

Real parts: the session's Temporal dev server behind a TLS proxy of the test process
(certificates generated here with openssl), real ``narwhal-worker`` / ``narwhal-restart``
processes.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from narwhal_models.restart import (
    EngineProgress,
    EngineRestartInput,
    RouterRef,
    SupervisorRef,
    engine_workflow_id,
)
from tests.integration.conftest import Temporal, wait_ready_line
from tests.integration.restart_support import FAST
from tests.support.procs import Proc, proc_group, script
from tests.support.temporal_tls import Certs, TlsProxy, make_certs

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def proxy(temporal: Temporal, certs: Certs) -> Iterator[TlsProxy]:
    p = TlsProxy(certs, temporal.address, require_client_cert=True)
    try:
        yield p
    finally:
        p.close()


def tls_env(certs: Certs) -> dict[str, str]:
    """The SDK's own environment names (temporalio.envconfig)."""
    return {
        "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(certs.ca),
        "TEMPORAL_TLS_CLIENT_CERT_PATH": str(certs.client_cert),
        "TEMPORAL_TLS_CLIENT_KEY_PATH": str(certs.client_key),
        "TEMPORAL_TLS_SERVER_NAME": "localhost",
    }


def restart_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([script("narwhal-restart"), *args], capture_output=True, text=True, timeout=90)


def wait_exit(proc: Proc, within: float = 90.0) -> str:
    deadline = time.monotonic() + within
    while proc.alive():
        if time.monotonic() > deadline:
            raise AssertionError(f"still running:\n{proc.output()[-2000:]}")
        time.sleep(0.1)
    return proc.output()


async def test_the_worker_reaches_temporal_through_a_tls_proxy_with_the_sdk_tls_settings(
    temporal: Temporal, proxy: TlsProxy, certs: Certs, tmp_path: Path
) -> None:
    queue = f"tls-{uuid.uuid4().hex[:8]}"
    base = [script("narwhal-worker"), "--address", proxy.address, "--task-queue", queue, "--grace", "1"]
    with proc_group(tmp_path) as group:
        worker = group.start("worker-tls", base, env=tls_env(certs))
        wait_ready_line(worker, timeout=60)
        assert proxy.handshakes >= 1
        # the worker runs tasks through the proxy: a start it must refuse comes back refused
        inp = EngineRestartInput(
            fleet="tls", iid="e0", router=RouterRef(name="unknown"), supervisor=SupervisorRef(backend="manual"),
            timing=FAST,
        )  # fmt: skip
        res: EngineProgress = await temporal.client.execute_workflow(
            "EngineRestart", inp, id=engine_workflow_id("tls", uuid.uuid4().hex[:6]), task_queue=queue,
            result_type=EngineProgress,
        )  # fmt: skip
        assert res.step == "failed" and "router 'unknown' is not in this worker's configuration" in res.error

        # the CLI through the same proxy, with flags instead of the environment
        flags = ["--tls-ca-cert", str(certs.ca), "--tls-cert", str(certs.client_cert),
                 "--tls-key", str(certs.client_key), "--tls-server-name", "localhost"]  # fmt: skip
        ok = restart_cli("list", "--address", proxy.address, *flags)
        assert ok.returncode == 0, ok.stdout + ok.stderr

        # without the TLS options: one line naming the address and what is missing, exit 2
        plain = group.start("worker-plain", base, env={})
        out = wait_exit(plain)
        assert plain.popen.returncode == 2, out
        assert f"cannot reach Temporal at {proxy.address}" in out and "may require TLS" in out, out
        # TLS but no client certificate: the proxy (mTLS) refuses the handshake
        no_cert = {k: v for k, v in tls_env(certs).items() if "CLIENT" not in k}
        one_way = group.start("worker-no-client-cert", base, env=no_cert)
        out = wait_exit(one_way)
        assert one_way.popen.returncode == 2 and f"cannot reach Temporal at {proxy.address}" in out, out
        assert "over TLS" in out, out
        cli_plain = restart_cli("list", "--address", proxy.address)
        assert cli_plain.returncode == 2 and "may require TLS" in cli_plain.stderr, cli_plain.stderr
