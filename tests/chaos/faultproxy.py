"""A fault-injecting HTTP proxy for an S3 endpoint (moto's server in the tests).

Threaded, on 127.0.0.1 and a free port; every request is forwarded to the upstream
endpoint unless the seeded schedule picks a fault for it:

============  ===============================================================
``error500``  ``500 InternalError`` (not forwarded)
``slowdown``  ``503 SlowDown`` throttling (not forwarded)
``drop``      the connection is closed before the request is forwarded
``lost``      the request is forwarded, then the connection is closed: the server
              applied it but the client never hears so (the retry sees the result)
``slow``      the response is delayed by up to `slow_s` seconds
============  ===============================================================

`outage` (a predicate on the request, or True) turns every request into a 500 until it
is cleared; `on_request` sees each ``(method, path)`` before the schedule does.
"""

from __future__ import annotations

import http.client
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

KINDS = ("error500", "slowdown", "drop", "lost", "slow")
_ERROR_BODY = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
    "<RequestId>faultproxy</RequestId></Error>"
)
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
                         "proxy-authorization", "proxy-authenticate"})


class FaultProxy:
    """See the module docstring. Use as a context manager, or `start` / `stop`."""

    def __init__(self, upstream: str, *, seed: int, rate: float = 0.0, kinds: tuple[str, ...] = KINDS,
                 slow_s: float = 0.5) -> None:
        parts = urlsplit(upstream)
        assert parts.hostname and parts.port, upstream
        self.upstream = (parts.hostname, parts.port)
        self.rng = random.Random(seed)
        self.rate = rate
        self.kinds = kinds
        self.slow_s = slow_s
        self.outage: bool | Callable[[str, str], bool] = False
        self.on_request: Callable[[str, str], None] | None = None
        self.injected: Counter[str] = Counter()
        self.requests = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FaultProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _any(self) -> None:
                proxy._handle(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="faultproxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FaultProxy:  # noqa: PYI034 - Python 3.10 has no typing.Self
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ per request

    def _decide(self, method: str, path: str) -> str | None:
        with self._lock:
            self.requests += 1
            if self.on_request is not None:
                self.on_request(method, path)
            outage = self.outage
            if outage is True or (callable(outage) and outage(method, path)):
                self.injected["outage"] += 1
                return "outage"
            if self.rate and self.rng.random() < self.rate:
                kind = self.rng.choice(self.kinds)
                self.injected[kind] += 1
                return kind
            return None

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        body = _read_body(handler)
        fault = self._decide(handler.command, handler.path)
        if fault in ("error500", "outage"):
            _send_error(handler, 500, "InternalError", "We encountered an internal error. Please try again.")
            return
        if fault == "slowdown":
            _send_error(handler, 503, "SlowDown", "Please reduce your request rate.")
            return
        if fault == "drop":
            _drop(handler)
            return
        if fault == "slow":
            with self._lock:
                delay = self.rng.uniform(0.05, self.slow_s)
            time.sleep(delay)
        status, reason, headers, payload = self._forward(handler, body)
        if fault == "lost":
            _drop(handler)
            return
        handler.send_response(status, reason)
        for name, value in headers:
            if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                handler.send_header(name, value)
        length = {k.lower(): v for k, v in headers}.get("content-length")
        if handler.command == "HEAD":
            handler.send_header("Content-Length", length or "0")
        else:
            handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(payload)

    def _forward(self, handler: BaseHTTPRequestHandler,
                 body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=120)
        try:
            headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP_BY_HOP}
            headers["Content-Length"] = str(len(body))
            conn.request(handler.command, handler.path, body=body, headers=headers)
            response = conn.getresponse()
            payload = response.read()
            return response.status, response.reason, response.getheaders(), payload
        finally:
            conn.close()


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int(handler.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            chunks.append(handler.rfile.read(size))
            handler.rfile.readline()
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else b""


def _send_error(handler: BaseHTTPRequestHandler, status: int, code: str, message: str) -> None:
    payload = _ERROR_BODY.format(code=code, message=message).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/xml")
    handler.send_header("Content-Length", "0" if handler.command == "HEAD" else str(len(payload)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(payload)


def _drop(handler: BaseHTTPRequestHandler) -> None:
    """Close the connection without a response (an RST, like a dying load balancer)."""
    handler.close_connection = True
    try:
        handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                      b"\x01\x00\x00\x00\x00\x00\x00\x00")
        handler.connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
