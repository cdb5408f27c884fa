"""A real etcd member behind TLS with client-certificate authentication, for integration tests.

``make_pki(dir)`` creates, with the ``openssl`` CLI, a CA, a server certificate for 127.0.0.1 and
a client certificate signed by that CA, plus a second client certificate signed by *another* CA (one
etcd must refuse). ``TlsEtcd`` starts one member whose client URL is ``https://127.0.0.1:<port>``
(``--client-cert-auth``: no certificate from the CA, no answer), stopped by its PID. ``call``
POSTs to the JSON gateway with the test's client certificate (setting up users and ``auth/enable``).
"""

from __future__ import annotations

import base64
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from narwhal_testing.etcd import ETCD
from narwhal_testing.procs import Proc, free_port


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    foreign_cert: Path  # signed by another CA
    foreign_key: Path


def _openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {done.stderr[-2000:]}")


def _ca(d: Path, name: str) -> tuple[Path, Path]:
    cert, key = d / f"{name}.pem", d / f"{name}.key"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert),
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return cert, key


def _signed(d: Path, name: str, ca: tuple[Path, Path], usage: str, subject: str = "") -> tuple[Path, Path]:
    cert, key, csr, ext = d / f"{name}.pem", d / f"{name}.key", d / f"{name}.csr", d / f"{name}.ext"
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        subject or f"/CN={name}",
        "-keyout",
        str(key),
        "-out",
        str(csr),
    )
    ext.write_text(f"subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage={usage}\n")
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
        "-days", "2", "-extfile", str(ext), "-out", str(cert),
    )  # fmt: skip
    return cert, key


def make_pki(d: Path) -> Pki:
    d.mkdir(parents=True, exist_ok=True)
    ca = _ca(d, "ca")
    # etcd's JSON gateway dials its own gRPC port with the server certificate (so it is a client
    # certificate too), and with authentication enabled etcd refuses a gateway request whose
    # client certificate has a CN (it would be taken as the user): no CN anywhere, the SAN names
    # the host and the user comes from /v3/auth/authenticate
    server = _signed(d, "server", ca, "serverAuth,clientAuth", subject="/O=narwhal-etcd")
    client = _signed(d, "client", ca, "clientAuth", subject="/O=narwhal-router")
    foreign = _signed(d, "foreign", _ca(d, "other-ca"), "clientAuth", subject="/O=narwhal-router")
    return Pki(ca[0], *server, *client, *foreign)


class TlsEtcd:
    """One etcd member: https client URL with client-certificate auth, plain-http peer URL."""

    def __init__(self, base: Path, pki: Pki) -> None:
        self.base, self.pki = base, pki
        self.port, self.peer_port = free_port(), free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        args = [
            ETCD,
            "--name", "tls0",
            "--data-dir", str(base / "tls0.data"),
            "--listen-client-urls", self.url,
            "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"tls0={peer}",
            "--initial-cluster-token", f"narwhal-tls-{self.port}",
            "--cert-file", str(pki.server_cert),
            "--key-file", str(pki.server_key),
            "--client-cert-auth",
            "--trusted-ca-file", str(pki.ca),
            "--log-level", "warn",
        ]  # fmt: skip
        self.proc = Proc(args, base / "tls0.log")
        self._ctx = ssl.create_default_context(cafile=str(pki.ca))
        self._ctx.load_cert_chain(str(pki.client_cert), str(pki.client_key))

    def call(self, path: str, body: dict[str, Any], token: str = "", timeout: float = 3.0) -> httpx.Response:
        headers = {"authorization": token} if token else {}
        with httpx.Client(verify=self._ctx, trust_env=False, timeout=timeout) as client:
            return client.post(f"{self.url}/v3/{path}", json=body, headers=headers)

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if not self.proc.alive():
                raise RuntimeError(f"etcd exited:\n{self.proc.output()[-3000:]}")
            try:
                r = self.call("kv/range", {"key": b64(b"health")}, timeout=1.5)
                if r.status_code == 200 and "header" in r.json():
                    return
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(0.1)
        raise TimeoutError(f"TLS etcd not healthy after {timeout}s ({last})")

    def enable_auth(self, password: str) -> None:
        """``root`` user with the ``root`` role, then ``auth enable`` (every call needs a token)."""
        for path, body in (
            ("auth/role/add", {"name": "root"}),
            ("auth/user/add", {"name": "root", "password": password}),
            ("auth/user/grant", {"user": "root", "role": "root"}),
            ("auth/enable", {}),
        ):
            r = self.call(path, body)
            if r.status_code != 200:
                raise RuntimeError(f"etcd {path}: HTTP {r.status_code} {r.text[:300]}")

    def close(self) -> None:
        self.proc.stop()


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()
