"""Which web pages may drive this server: the ``Origin`` and ``Host`` checks and ``--cors``.

A browser lets any page send requests to any address, this machine's loopback included:
a page on another site can POST to ``http://127.0.0.1:8080`` (a form or a ``text/plain``
fetch needs no CORS preflight) and open a WebSocket to it. CORS only keeps the page from
reading most answers; the request has already run. So the guard looks at the ``Origin``
a browser puts on such requests and refuses the ones from other sites (:func:`cross_site`).
A page can also reach loopback under its own name by DNS rebinding (``evil.example``
resolving to 127.0.0.1), where its requests are same-origin to the browser; so a client on
loopback must name this machine in ``Host`` (:func:`host_refusal`).

``--cors ORIGIN`` names sites the user trusts: their pages may do everything this server's
own page may, and their answers carry CORS headers. ``*`` (and ``null``, what pages opened
from a file and sandboxed frames send) opens the API routes to every site, never the
admin routes or the chat's socket.

Pure functions over strings, no web framework: the in-process guard and the ``--isolate``
parent share them.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from urllib.parse import urlsplit

ANY, NULL = "*", "null"
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
CORS_METHODS = b"GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"
CORS_MAX_AGE = b"600"


@dataclass(frozen=True)
class Site:
    """An origin: scheme, host (lower case, IPv6 without brackets) and port."""

    scheme: str
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        return is_loopback_name(self.host)

    def same_as(self, other: Site) -> bool:
        """The same origin, counting every loopback name as one host."""
        return (self.scheme == other.scheme and self.port == other.port
                and (self.host == other.host or (self.loopback and other.loopback)))

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = "" if DEFAULT_PORTS.get(self.scheme) == self.port else f":{self.port}"
        return f"{self.scheme}://{host}{port}"


def is_loopback_name(host: str) -> bool:
    """``localhost`` (and ``*.localhost``, which browsers keep on loopback) or a loopback
    address (127.0.0.0/8, ::1, IPv4-mapped too)."""
    host = host.lower().rstrip(".").strip("[]")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def parse_origin(text: str) -> Site | None:
    """``scheme://host[:port]`` as a browser sends it, or None (``null``, anything else)."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path \
            or parts.query or parts.fragment or parts.username is not None:
        return None
    return Site(parts.scheme, parts.hostname.lower(), port or DEFAULT_PORTS[parts.scheme])


def parse_host(header: str, scheme: str) -> tuple[str, int] | None:
    """A ``Host`` header's (host, port); None when it is no host at all."""
    try:
        parts = urlsplit("//" + header.strip())
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname or parts.path or parts.query or parts.username is not None:
        return None
    return parts.hostname.lower(), port or DEFAULT_PORTS.get(scheme, 80)


def cors_value(text: str) -> str:
    """One ``--cors`` value checked: ``*``, ``null`` or an origin (canonical form);
    ValueError says what a valid one looks like."""
    value = text.strip()
    if value in (ANY, NULL):
        return value
    site = parse_origin(value.rstrip("/"))
    if site is None:
        raise ValueError(f"--cors {text!r}: expected an origin such as https://app.example.com "
                         "or http://localhost:5173 (scheme, host and port; no path), "
                         "'*' or 'null'")
    return str(site)


@cache
def _machine_names() -> frozenset[str]:
    """This machine's own names: some systems map the host name to 127.0.1.1."""
    names = {socket.gethostname().lower()}
    with contextlib.suppress(OSError):
        names.add(socket.getfqdn().lower())
    return frozenset(n for n in names if n)


@dataclass(frozen=True)
class CorsRules:
    """The sites ``--cors`` allows: named ones fully, ``*``/``null`` the API routes only."""

    sites: tuple[Site, ...] = ()
    any_site: bool = False
    null_origin: bool = False
    names: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def from_values(cls, values: Iterable[str]) -> CorsRules:
        """From ``--cors`` values (ValueError for one that is no origin)."""
        checked = [cors_value(v) for v in values]
        sites = tuple(s for s in (parse_origin(v) for v in checked) if s is not None)
        return cls(sites, ANY in checked, NULL in checked, frozenset(s.host for s in sites))

    @property
    def wildcard(self) -> bool:
        return self.any_site or self.null_origin

    def named(self, origin: str) -> bool:
        """An origin the user named (a trusted site)."""
        site = parse_origin(origin)
        return site is not None and any(site.same_as(s) for s in self.sites)

    def allows(self, origin: str, api_route: bool) -> bool:
        """Whether a page at ``origin`` may make this request (``api_route``: not an admin
        route nor the chat's socket, where a wildcard does not reach)."""
        if self.named(origin):
            return True
        if not api_route:
            return False
        return self.any_site or (self.null_origin and origin.strip() == NULL)

    def known_host(self, host: str) -> bool:
        return host in self.names


def own_origin(origin: str, host_header: str | None, scheme: str) -> bool:
    """Whether ``origin`` is this server as the request reached it (``Host``, scheme)."""
    site = parse_origin(origin)
    if site is None or not host_header:
        return False
    scheme = {"ws": "http", "wss": "https"}.get(scheme, scheme)
    host = parse_host(host_header, scheme)
    return host is not None and site.same_as(Site(scheme, *host))


def host_refusal(host_header: str | None, scheme: str, cors: CorsRules) -> str | None:
    """Why a loopback client's ``Host`` is refused (DNS rebinding), or None. Accepted:
    loopback names and addresses, any IP literal (rebinding needs a name), this machine's
    own names, and the hosts of ``--cors`` origins (a reverse proxy's public name)."""
    if not host_header:
        return None  # HTTP/1.0 without Host: no browser sends that
    parsed = parse_host(host_header, scheme)
    if parsed is None:
        return f"Host {host_header!r} is not a host name"
    host = parsed[0]
    if is_loopback_name(host) or is_ip_literal(host) or host in _machine_names() \
            or cors.known_host(host):
        return None
    return (f"Host {host!r} is not this machine's name: a loopback client must use localhost "
            "or 127.0.0.1 (a page that points its own name at this machine is refused); "
            "for another name of yours (a reverse proxy, an /etc/hosts alias) start the "
            "server with --cors http://NAME:PORT")


def cross_site(origin: str | None, fetch_site: str | None, own: bool, *, unsafe: bool,
               api_route: bool, cors: CorsRules) -> str | None:
    """Why a browser request from another site is refused, or None.

    ``unsafe``: a state-changing method or a WebSocket handshake; ``api_route``: neither an
    admin route nor the chat's socket (admin routes refuse other sites on every method:
    ``GET /v1/memory/synthesize`` writes). A request without ``Origin`` comes from an SDK,
    curl or a same-origin GET; ``Sec-Fetch-Site`` still tells a cross-site ``<img>`` or
    no-cors GET of an admin route, which carries no ``Origin``.
    """
    if origin is None:
        if not api_route and fetch_site in ("cross-site", "same-site"):
            return f"a request from another site ({fetch_site}) to an admin route"
        return None
    if own or cors.allows(origin, api_route):
        return None
    if api_route and not unsafe:  # a read: without CORS headers the page cannot see it
        return None
    where = "this route" if api_route else "admin routes and the chat"
    return (f"Origin {origin!r} is not this server: pages of other sites may not use {where}; "
            f"start the server with --cors {origin} to trust that site")


def cors_headers(origin: str, cors: CorsRules, api_route: bool) -> list[tuple[bytes, bytes]]:
    """The CORS headers for an answer to ``origin`` (none for a site ``--cors`` does not
    allow)."""
    if not cors.allows(origin, api_route):
        return []
    return [(b"access-control-allow-origin", origin.strip().encode("latin-1")),
            (b"vary", b"Origin"), (b"access-control-expose-headers", b"*")]


def preflight_headers(origin: str, requested: str | None, cors: CorsRules,
                      api_route: bool) -> list[tuple[bytes, bytes]] | None:
    """A CORS preflight's answer headers, or None when ``origin`` is not allowed."""
    headers = cors_headers(origin, cors, api_route)
    if not headers:
        return None
    allow = (requested or "authorization, content-type, x-api-key").encode("latin-1")
    return headers + [(b"access-control-allow-methods", CORS_METHODS),
                      (b"access-control-allow-headers", allow),
                      (b"access-control-max-age", CORS_MAX_AGE)]
