"""One-shot HTTP calls to loopback services (routers, simulated engines, supervisors, etcd) without
building a TLS context per call.

``httpx.get`` / ``httpx.post`` build a new client per call, and every new client builds an SSL
context that loads the CA bundle: about 35-40 ms of CPU, for plain-HTTP loopback URLs that never use
it. A wait polling every 50 ms spent most of a core on that, beside the processes under test. These
functions make the same one-shot calls (a new client and connection per call, nothing pooled or kept
alive between calls) around one SSL context built once; ``client`` / ``async_client`` are
``httpx.Client`` / ``httpx.AsyncClient`` with that context.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

TLS = ssl.create_default_context()  # built once; only an https:// URL would use it


def get(url: str, **kw: Any) -> httpx.Response:
    return httpx.get(url, verify=TLS, **kw)


def post(url: str, **kw: Any) -> httpx.Response:
    return httpx.post(url, verify=TLS, **kw)


@contextmanager
def stream(method: str, url: str, **kw: Any) -> Iterator[httpx.Response]:
    with httpx.stream(method, url, verify=TLS, **kw) as response:
        yield response


def client(**kw: Any) -> httpx.Client:
    return httpx.Client(verify=TLS, **kw)


def async_client(**kw: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(verify=TLS, **kw)
