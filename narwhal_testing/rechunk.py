"""A loopback HTTP proxy in front of one engine that re-sends its event streams as 1-byte HTTP
chunks, in one burst (the worst shape of a chunked body for whoever parses it). It runs in threads
of the test process. Every other response is forwarded as it came.

An event-stream response is collected whole from the engine, then sent on as
``1\\r\\n<byte>\\r\\n`` chunks with one ``sendall``, all but its last ``hold`` body bytes and the
last chunk; those follow on ``release()``. ``burst_sent`` is set once a burst is out, so a test can
act while the stream is still open at the router.
"""

from __future__ import annotations

import contextlib
import socket
import threading

import httptools

from narwhal_testing.procs import free_port


def one_byte_chunks(body: bytes) -> bytes:
    return b"".join(b"1\r\n%c\r\n" % c for c in body)


class _Response:
    """httptools callbacks for one engine response."""

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()
        self.complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True

    @property
    def event_stream(self) -> bool:
        return any(n.lower() == b"content-type" and b"text/event-stream" in v for n, v in self.headers)


class RechunkProxy:
    def __init__(self, target_port: int, hold: int = 0) -> None:
        self.target = ("127.0.0.1", target_port)
        self.port = free_port()
        self.hold = hold
        self.burst_sent = threading.Event()
        self._release = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._server.settimeout(0.1)
        threading.Thread(target=self._accept_loop, name=f"rechunk-{self.port}", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def release(self) -> None:
        self._release.set()

    def close(self) -> None:
        self._stop.set()
        self._release.set()
        with self._lock:
            socks, self._socks = self._socks, []
        for s in [*socks, self._server]:
            with contextlib.suppress(OSError):
                s.close()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._socks += [client, upstream]
            threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._responses, args=(upstream, client), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                upstream.sendall(data)
        with contextlib.suppress(OSError):
            upstream.shutdown(socket.SHUT_WR)

    def _responses(self, upstream: socket.socket, client: socket.socket) -> None:
        """One response at a time (the router does not pipeline): collected whole, then sent on."""
        with contextlib.suppress(OSError):
            raw = bytearray()
            resp = _Response()
            parser = httptools.HttpResponseParser(resp)
            while data := upstream.recv(65536):
                raw += data
                parser.feed_data(data)
                if not resp.complete:
                    continue
                if resp.event_stream:
                    self._burst(client, bytes(raw[: raw.index(b"\r\n\r\n") + 4]), bytes(resp.body))
                else:
                    client.sendall(raw)
                raw = bytearray()
                resp = _Response()
                parser = httptools.HttpResponseParser(resp)
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_WR)

    def _burst(self, client: socket.socket, head: bytes, body: bytes) -> None:
        cut = max(0, len(body) - self.hold)
        client.sendall(head + one_byte_chunks(body[:cut]))
        self.burst_sent.set()
        self._release.wait()
        client.sendall(one_byte_chunks(body[cut:]) + b"0\r\n\r\n")
