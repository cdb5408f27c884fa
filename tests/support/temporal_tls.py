"""Certificates generated in the test (``openssl``) and a TLS-terminating proxy in front of a
plaintext Temporal frontend, so the worker and CLI can be tested with TLS / mTLS for real.

The proxy runs its own asyncio loop in a thread of the test process, negotiates ALPN ``h2``
(gRPC), requires a client certificate signed by the test CA when ``require_client_cert``, and
forwards the decrypted bytes to the frontend.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _leaf(d: Path, name: str, cn: str, ext: str) -> tuple[Path, Path]:
    (d / f"{name}.ext").write_text(ext)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)  # fmt: skip
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)  # fmt: skip
    return d / f"{name}.pem", d / f"{name}.key"


def make_certs(d: Path) -> Certs:
    """A CA, a server certificate for ``localhost``/127.0.0.1 and a client certificate."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=narwhal-test-ca",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)  # fmt: skip
    common = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
    server = _leaf(d, "server", "localhost",
                   common + "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n")  # fmt: skip
    client = _leaf(d, "client", "narwhal-worker", common + "extendedKeyUsage=clientAuth\n")
    return Certs(d / "ca.pem", *server, *client)


class TlsProxy:
    """``127.0.0.1:<port>`` speaking TLS → the plaintext frontend at ``upstream`` (host:port)."""

    def __init__(self, certs: Certs, upstream: str, require_client_cert: bool = True) -> None:
        self.upstream_host, port = upstream.rsplit(":", 1)
        self.upstream_port = int(port)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(certs.server_cert, certs.server_key)
        ctx.set_alpn_protocols(["h2"])
        if require_client_cert:
            ctx.load_verify_locations(certs.ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
        self.ctx = ctx
        self.handshakes = 0  # completed TLS handshakes (a client that got through)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._run, name="tls-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10) or self._server is None:
            raise RuntimeError("TLS proxy did not start")
        self.port = int(self._server.sockets[0].getsockname()[1])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ctx, ssl_handshake_timeout=10)
        )
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.handshakes += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (OSError, ssl.SSLError):
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                dst.close()

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
