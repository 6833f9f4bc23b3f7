"""`Gate`: who may ask, checked before any route runs: the Host name, the API key, the open
connections' cap; and every request counted in the metrics.

Only loopback Host names are answered on a server bound to loopback (unless
--allowed-hosts), so a web page a user visits cannot, through DNS rebinding, read a local
server that has no key. `client_of` names the client a request counts against.
"""

from __future__ import annotations

import hmac
import ipaddress
import time

from starlette.requests import ClientDisconnect

from .config import ServerConfig
from .connections import ALWAYS, Connections, is_loopback
from .errors import ApiError, error_response, internal_error
from .metrics import Metrics


def client_of(scope, trusted_proxies) -> str:
    """The client a request counts against: the peer address, or, when the peer is a trusted
    proxy, the nearest X-Forwarded-For address that is not one."""
    peer = scope["client"][0] if scope.get("client") else "-"
    if not trusted_proxies or not _trusted(peer, trusted_proxies):
        return peer
    forwarded = [v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"x-forwarded-for"]
    hops = [h.strip() for h in ",".join(forwarded).split(",") if h.strip()]
    for hop in reversed(hops):  # the right end was added by our own proxies
        if not _trusted(hop, trusted_proxies):
            return hop
    return hops[0] if hops else peer


def _trusted(address: str, networks) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return False
    return any(ip in net for net in networks)


def host_name(scope) -> str | None:
    """The Host header without its port, lower-case; None if absent."""
    for name, value in scope.get("headers", ()):
        if name == b"host":
            host = value.decode("latin-1").strip().lower()
            if host.startswith("["):  # [::1]:8000
                return host[1:host.find("]")] if "]" in host else host
            return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return None


class Gate:
    """ASGI middleware: the Host check, bearer auth (except on the ``public`` paths) and
    request metrics per path of ``endpoints`` (499 for a client that left, streaming or not)."""

    def __init__(self, app, config: ServerConfig, metrics: Metrics, connections: Connections,
                 endpoints: frozenset[str], public: frozenset[str]):
        self.app, self.config, self.metrics, self.connections = app, config, metrics, connections
        self.endpoints, self.public = endpoints, public
        self._key = config.api_key.encode() if config.api_key else None

    def _host_allowed(self, scope) -> bool:
        allowed = self.config.allowed_hosts
        if allowed is not None and "*" in allowed:
            return True
        host = host_name(scope)
        if host is None:
            return False
        host = host.rstrip(".")
        return is_loopback(host) if allowed is None else host in allowed

    async def _refuse(self, err: ApiError, scope, receive, send):
        await error_response(err, self.metrics)(scope, receive, send)

    def _authorized(self, scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key)
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        endpoint = path if path in self.endpoints else "other"
        scope.setdefault("state", {})["arrived"] = start = time.perf_counter()
        status = [0]

        async def send_tracked(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                headers = list(message.get("headers", ()))
                if not any(name.lower() == b"x-content-type-options" for name, _ in headers):
                    # a browser must not read a JSON error (or anything else) as HTML
                    headers.append((b"x-content-type-options", b"nosniff"))
                message = {**message, "headers": headers}
            await send(message)

        try:
            if self.connections.total > self.connections.max_total and path not in ALWAYS:
                err = ApiError(503, f"the server has more than {self.connections.max_total} open "
                                    "connections (--max-connections): try again later",
                               type="server_error", code="too_many_connections",
                               headers={"Retry-After": "1"})
                await self._refuse(err, scope, receive, send_tracked)
            elif not self._host_allowed(scope):
                err = ApiError(400, f"Host {host_name(scope)!r} is not served here: use a loopback "
                                    "address, or start the server with --allowed-hosts",
                               code="invalid_host")
                await self._refuse(err, scope, receive, send_tracked)
            elif self._key is not None and path not in self.public and not self._authorized(scope):
                err = ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                               code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                await self._refuse(err, scope, receive, send_tracked)
            else:
                # /health shows its details to key holders only (`health`)
                scope["state"]["authorized"] = self._key is None or self._authorized(scope)
                await self.app(scope, receive, send_tracked)
        except ClientDisconnect:  # a response could not be sent: its client left
            scope["state"]["client_gone"] = True
        except Exception as exc:  # a bug of ours: one log line and a 500 (not uvicorn's second
            # traceback, which Starlette's error middleware would add by re-raising it)
            err = internal_error(exc, f"{scope.get('method')} {path} failed")
            if not status[0]:
                await self._refuse(err, scope, receive, send_tracked)
            status[0] = status[0] or 500
        finally:
            gone = scope["state"].get("client_gone")  # set by a stream whose client left
            self.metrics.requests.labels(endpoint, "499" if gone else str(status[0] or 499)).inc()
            self.metrics.latency.labels(endpoint).observe(time.perf_counter() - start)
