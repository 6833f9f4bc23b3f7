"""Open connections, bounded so that idle ones cannot lock everyone out (issue 42).

32 connections that sent nothing (or a request head one byte at a time) held uvicorn's
``limit_concurrency`` at its cap, and every other client, /health included, got 503. Here:

- a connection that has not sent a complete request head within ``head_timeout`` seconds
  (after it opened, or after its last response) gets 408 and is closed;
- one client address may hold at most ``per_client`` connections (trusted proxies, which carry
  many clients, are not capped); more are refused at once with 503;
- past ``max_total`` open connections, requests get 503, except /health (`ALWAYS`), which
  `HEALTH_ROOM` more connections keep answerable for a load balancer or a person.

`Connections` counts; `protocol` is uvicorn's HTTP protocol class with the counting and the
timer added (uvicorn's ``http=`` option); the app's Gate refuses requests past the total.
"""

from __future__ import annotations

import ipaddress
from collections import Counter

ALWAYS = {"/health"}  # answered at the total cap too
HEALTH_ROOM = 8  # connections beyond --max-connections that only ALWAYS paths are served on
HEAD_END = b"\r\n\r\n"


def _response(status: bytes, message: bytes, *headers: bytes) -> bytes:
    return b"\r\n".join([b"HTTP/1.1 " + status, b"content-type: text/plain; charset=utf-8",
                         b"content-length: " + str(len(message)).encode(), b"connection: close",
                         *headers, b"", message])


class Connections:
    def __init__(self, max_total: int, per_client: int, head_timeout: float, trusted_proxies=()):
        self.max_total, self.per_client, self.head_timeout = max_total, per_client, head_timeout
        self.trusted_proxies = trusted_proxies  # ip_networks whose connections are not capped
        self.by_address: Counter[str] = Counter()
        self.total = 0

    def capped(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return True
        return not any(ip in net for net in self.trusted_proxies)

    def protocol(self, base: type | None = None) -> type:
        """``base`` (default: uvicorn's own choice, httptools or h11) counting its connections
        here and timing out incomplete request heads."""
        if base is None:
            from uvicorn.protocols.http.auto import AutoHTTPProtocol as base
        connections = self

        class Bounded(base):
            def connection_made(self, transport) -> None:
                super().connection_made(transport)
                self._address = self.client[0] if self.client else "-"
                self._counted, self._timer, self._tail = False, None, b""
                if connections.total >= connections.max_total + HEALTH_ROOM:
                    return self._refuse(b"the server has too many open connections: try again later")
                if connections.capped(self._address) and \
                        connections.by_address[self._address] >= connections.per_client:
                    return self._refuse(b"too many open connections from your address "
                                        b"(--max-connections-per-client): close some, or reuse one")
                connections.by_address[self._address] += 1
                connections.total += 1
                self._counted = True
                self._wait_for_head()

            def _refuse(self, message: bytes) -> None:
                self.transport.write(_response(b"503 Service Unavailable", message, b"retry-after: 1"))
                self.transport.close()

            def _wait_for_head(self) -> None:
                self._tail = b""
                self._timer = self.loop.call_later(connections.head_timeout, self._head_timed_out)

            def _head_timed_out(self) -> None:
                self._timer = None
                busy = self.cycle is not None and not self.cycle.response_complete
                if not busy and not self.transport.is_closing():
                    self.transport.write(_response(
                        b"408 Request Timeout",
                        f"no complete request head within {connections.head_timeout:g} s".encode()))
                    self.transport.close()

            def data_received(self, data: bytes) -> None:
                if self._timer is not None:
                    seen = self._tail + data
                    if HEAD_END in seen:
                        self._timer.cancel()
                        self._timer = None
                    self._tail = seen[-(len(HEAD_END) - 1):]
                super().data_received(data)

            def on_response_complete(self) -> None:
                super().on_response_complete()
                if self._timer is None and not self.transport.is_closing():
                    self._wait_for_head()  # the next request's head, on a kept-alive connection

            def connection_lost(self, exc) -> None:
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                if self._counted:
                    self._counted = False
                    connections.total -= 1
                    connections.by_address[self._address] -= 1
                    if not connections.by_address[self._address]:
                        del connections.by_address[self._address]
                super().connection_lost(exc)

        return Bounded


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False
