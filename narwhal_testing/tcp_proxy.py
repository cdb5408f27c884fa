"""A loopback TCP proxy that a test can cut and restore (a network partition between a router and
etcd). It runs in a thread of the test process: ``cut()`` closes every open connection and
refuses (accepts then drops) new ones; ``restore()`` forwards again.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading

from narwhal_testing.procs import free_port


class TcpProxy:
    def __init__(self, target_port: int, listen_port: int | None = None) -> None:
        self.target = ("127.0.0.1", target_port)
        self.port = listen_port or free_port()
        self._cut = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._server = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        self._server.settimeout(0.1)
        self._thread = threading.Thread(target=self._accept_loop, name=f"tcp-proxy-{self.port}", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> None:
        self._cut.set()
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def restore(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self._stop.set()
        self.cut()
        self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self._server.close()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._cut.is_set():
                with contextlib.suppress(OSError):
                    client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=2)
            except OSError:
                with contextlib.suppress(OSError):
                    client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        try:
            # a cut() between the accept and here has already closed both sockets
            a.setblocking(False)
            b.setblocking(False)
            sel.register(a, selectors.EVENT_READ, b)
            sel.register(b, selectors.EVENT_READ, a)
            while not self._stop.is_set() and not self._cut.is_set():
                for key, _ in sel.select(timeout=0.2):
                    src: socket.socket = key.fileobj  # type: ignore[assignment]
                    dst: socket.socket = key.data
                    try:
                        data = src.recv(65536)
                    except BlockingIOError:
                        continue
                    if not data:
                        return
                    dst.setblocking(True)
                    dst.sendall(data)
                    dst.setblocking(False)
        except (OSError, ValueError):  # ValueError: a socket closed under the selector
            return
        finally:
            sel.close()
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()
