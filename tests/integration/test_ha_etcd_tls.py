"""The etcd backend over TLS with client certificates, and with etcd authentication: a real etcd
member (``--client-cert-auth``), certificates made in the test with the openssl CLI, real routers."""

from __future__ import annotations

import base64
import json
import os
import ssl
from pathlib import Path

import httpx
import pytest

from tests.support.etcd import etcd_installed
from tests.support.etcd_ha import etcd_router
from tests.support.etcd_tls import TlsEtcd, b64, make_pki
from tests.support.fleet import start_sims
from tests.support.ha import controls, drain, epoch_of, held, ready
from tests.support.procs import proc_group
from tests.support.waits import wait_for

pytestmark = pytest.mark.integration
PREFIX = "/narwhal/tls/"


def _stored_handoff(etcd: TlsEtcd, token: str = "") -> dict[str, object]:
    r = etcd.call("kv/range", {"key": b64((PREFIX + "handoff").encode())}, token=token)
    assert r.status_code == 200, r.text
    doc: dict[str, object] = json.loads(base64.b64decode(r.json()["kvs"][0]["value"]))
    return doc


def _refused(router: object, words: str) -> bool:
    reason = str(ready(router)[1].get("reason", ""))  # type: ignore[arg-type]
    return reason.startswith("lease unavailable: cannot claim lease:") and words in reason


def test_etcd_with_tls_client_certificates_and_authentication(tmp_path: Path) -> None:
    if not etcd_installed():
        pytest.fail("etcd is not installed (scripts/bootstrap.sh installs Debian's etcd-server)")
    pki = make_pki(tmp_path / "pki")
    etcd = TlsEtcd(tmp_path, pki)
    try:
        etcd.wait_healthy()
        # etcd itself refuses a TLS client without a certificate
        with pytest.raises(httpx.HTTPError):
            ctx = ssl.create_default_context(cafile=str(pki.ca))
            httpx.post(etcd.url + "/v3/kv/range", json={"key": b64(b"x")}, verify=ctx, timeout=3)
        tls = [
            "--etcd-cacert",
            str(pki.ca),
            "--etcd-cert",
            str(pki.client_cert),
            "--etcd-key",
            str(pki.client_key),
        ]
        with proc_group(tmp_path) as group:
            sims = start_sims(group, 2, itl_ms=2)
            a = etcd_router(group, tmp_path, sims, "a", etcd.url, PREFIX, *tls, wait_ready=True)
            assert epoch_of(a) == 1 and controls(a)
            assert drain(a, "e0").status_code == 200
            assert _stored_handoff(etcd)["epoch"] == 1  # the fenced write went through TLS
            # no client certificate, or one from another CA: no lease, the reason on /ready
            foreign = ["--etcd-cert", str(pki.foreign_cert), "--etcd-key", str(pki.foreign_key)]
            for name, flags in (
                ("n", ["--etcd-cacert", str(pki.ca)]),
                ("f", ["--etcd-cacert", str(pki.ca), *foreign]),
            ):
                r = etcd_router(group, tmp_path, sims, name, etcd.url, PREFIX, *flags)
                wait_for(f"{name} refused", lambda r=r: _refused(r, "etcd unavailable"), timeout=60)
                assert not controls(r) and controls(a)
                r.proc.stop()
            a.proc.stop()  # revokes its etcd lease
            # etcd authentication on top of TLS: the password comes from an environment variable
            etcd.enable_auth("s3cret-pw")
            auth = ["--etcd-user", "root", "--etcd-password-env", "NARWHAL_TEST_ETCD_PASSWORD"]
            env = {**os.environ, "NARWHAL_TEST_ETCD_PASSWORD": "s3cret-pw"}
            c = etcd_router(group, tmp_path, sims, "c", etcd.url, PREFIX, *tls, *auth, "--resume", env=env)
            try:
                wait_for("c controls", lambda: controls(c), timeout=60)
            except AssertionError:
                raise AssertionError(f"{ready(c)}\n{c.proc.output()[-2000:]}") from None
            assert epoch_of(c) == 2 and held(c, "e0")  # resumed from the etcd handoff
            wrong = {**os.environ, "NARWHAL_TEST_ETCD_PASSWORD": "not-it"}
            w = etcd_router(group, tmp_path, sims, "w", etcd.url, PREFIX, *tls, *auth, env=wrong)
            wait_for(
                "wrong password refused",
                lambda: _refused(w, "etcd authentication as 'root' refused"),
                timeout=60,
            )
            assert not controls(w) and controls(c)
            assert "s3cret" not in w.proc.output() and "not-it" not in w.proc.output()
            plain = etcd_router(group, tmp_path, sims, "p", etcd.url, PREFIX, *tls)  # certificate, no user
            wait_for(
                "no user refused",
                lambda: str(ready(plain)[1].get("reason", "")).startswith("lease unavailable"),
                timeout=60,
            )
            assert controls(c)
    finally:
        etcd.close()
