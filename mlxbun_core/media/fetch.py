"""Fetch media named by a request: ``data:`` URLs locally, http(s) URLs under a
destination policy.

A URL in a request is attacker-controlled, and the server usually sits next to
things an outsider must not reach (a router page, a cloud metadata service, an
admin port on loopback). So before any byte leaves the machine:

* only ``http`` and ``https`` are fetched;
* the host is resolved here (through :attr:`FetchPolicy.resolver`, which tests
  replace) and every address it resolves to must be a public unicast address:
  private, loopback, link-local, shared (CGNAT), multicast, reserved and
  unspecified ones are refused, IPv4-mapped/6to4/NAT64 IPv6 forms included;
* the connection goes to the address that was checked (the URL is rewritten to
  the IP; ``Host`` and TLS SNI/certificate checks keep the real name), so a second
  DNS answer cannot swap in another target (no rebinding);
* redirects are followed by hand, each hop checked the same way;
* one deadline (10 s) covers the whole fetch, and the body is capped while it
  streams (64 MB; 256 MB for video).

``--allow-private-media`` (``MLXBUN_ALLOW_PRIVATE_MEDIA=1``) lets LAN hosts
(private, loopback, link-local, CGNAT) through; multicast, reserved and unspecified
addresses stay refused. Every refusal is a 400 ``prompt build failed: <kind> url
rejected: …``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import unquote_to_bytes, urljoin, urlsplit, urlunsplit

from ..errors import BadRequest
from ..runconfig import current

MB = 1 << 20
SIZE_LIMITS = {"image": 64 * MB, "audio": 64 * MB, "video": 256 * MB}
Resolver = Callable[[str, int], Awaitable[list]]


class MediaRejected(BadRequest):
    """A media URL the policy refuses, or one that could not be fetched or read."""


async def system_resolver(host: str, port: int) -> list:
    """Every address ``host`` resolves to (the OS resolver, off the event loop)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [info[4][0] for info in infos]


@dataclass
class FetchPolicy:
    """Where remote media may come from, and how much of it."""

    allow_private: bool | None = None
    """LAN hosts allowed; None: as the run configuration says (``allow_private_media``)."""
    timeout_s: float = 10.0
    max_redirects: int = 5
    size_limits: dict = field(default_factory=lambda: dict(SIZE_LIMITS))
    resolver: Resolver = system_resolver
    trusted_networks: tuple = ()
    """Networks allowed whatever their class (an operator's allowlist, e.g. one NAS)."""

    def private_allowed(self) -> bool:
        if self.allow_private is None:
            return current().server.allow_private_media
        return self.allow_private

    def limit(self, kind: str) -> int:
        return self.size_limits.get(kind, SIZE_LIMITS["image"])


policy = FetchPolicy()
"""The process-wide policy; ``mlxbun serve --allow-private-media`` sets ``allow_private``."""


# ---------------------------------------------------------------- addresses

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_LAN_ONLY = ("private", "loopback", "link-local", "shared (CGNAT)")


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (mapped, 6to4, Teredo, NAT64), if any."""
    if ip.ipv4_mapped:
        return ip.ipv4_mapped
    if ip.sixtofour:
        return ip.sixtofour
    if ip.teredo:
        return ip.teredo[1]
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_class(addr: str) -> str | None:
    """What makes ``addr`` a non-public destination, or ``None`` for a public one."""
    ip = ipaddress.ip_address(addr.split("%", 1)[0])  # drop an IPv6 zone id
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_v4(ip)
        if inner is not None:
            return address_class(str(inner))
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_reserved:
        return "reserved"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT:
        return "shared (CGNAT)"
    if ip.is_private:
        return "private"
    if not ip.is_global:
        return "reserved"
    return None


def refusal(addr: str, allow_private: bool, trusted=()) -> str | None:
    """The class of address that makes the policy refuse ``addr`` (``None``: allowed)."""
    cls = address_class(addr)
    if cls is None or (allow_private and cls in _LAN_ONLY):
        return None
    ip = ipaddress.ip_address(addr.split("%", 1)[0])
    if any(ip in ipaddress.ip_network(net) for net in trusted):
        return None
    return cls


# ---------------------------------------------------------------- data: URLs

def decode_data_url(url: str, kind: str, limit: int) -> tuple[bytes, str | None]:
    """``data:[mime][;base64],payload`` → (bytes, mime). Malformed → 400."""
    head, sep, payload = url[5:].partition(",")
    if not sep:
        raise MediaRejected(f"prompt build failed: malformed data URL for {kind} (no comma)")
    params = head.split(";")
    mime = params[0].strip().lower() or None
    if "base64" in (p.strip().lower() for p in params[1:]):
        data = decode_base64(payload, f"{kind} data URL", limit)
    else:
        data = unquote_to_bytes(payload)
    if len(data) > limit:
        raise MediaRejected(f"prompt build failed: {kind} data URL is over {limit // MB} MB")
    return data, mime


def decode_base64(text: str, what: str, limit: int) -> bytes:
    """Strict base64 (whitespace allowed, padding optional); bad input → 400."""
    if not isinstance(text, str):
        raise MediaRejected(f"prompt build failed: {what} must be a base64 string")
    compact = "".join(text.split())
    if len(compact) * 3 // 4 > limit + 3:
        raise MediaRejected(f"prompt build failed: {what} is over {limit // MB} MB")
    compact += "=" * (-len(compact) % 4)
    try:
        data = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        data = None
    if not data:
        raise MediaRejected(f"prompt build failed: {what} is not valid base64")
    return data


# ---------------------------------------------------------------- http(s)

async def fetch(url: str, kind: str = "image",
                pol: FetchPolicy | None = None) -> tuple[bytes, str | None]:
    """Fetch ``url`` (``data:``, ``http:`` or ``https:``) → (bytes, content type)."""
    pol = pol or policy
    if not isinstance(url, str) or not url.strip():
        raise MediaRejected(f"prompt build failed: {kind} url must be a non-empty string")
    url = url.strip()
    if url[:5].lower() == "data:":
        return decode_data_url(url, kind, pol.limit(kind))
    try:
        return await asyncio.wait_for(_fetch_remote(url, kind, pol), pol.timeout_s)
    except asyncio.TimeoutError:
        raise MediaRejected(f"prompt build failed: {kind} url timed out after "
                            f"{pol.timeout_s:g} s") from None


def _rejected(kind: str, why: str) -> MediaRejected:
    return MediaRejected(f"prompt build failed: {kind} url rejected: {why}")


async def _pin(url: str, kind: str, pol: FetchPolicy) -> tuple[str, str, str]:
    """Check ``url`` and resolve it: (URL aimed at the checked IP, Host header, hostname)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise _rejected(kind, f"scheme {scheme or '(none)'!r} is not http or https")
    if parts.username is not None or parts.password is not None:
        raise _rejected(kind, "credentials in the URL are not allowed")
    host = parts.hostname
    if not host:
        raise _rejected(kind, "no host")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise _rejected(kind, "bad port") from None
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
        addrs = [host]
    except ValueError:
        try:
            addrs = list(dict.fromkeys(await pol.resolver(host, port)))
        except OSError as exc:
            raise _rejected(kind, f"cannot resolve {host}: {exc}") from None
        if not addrs:
            raise _rejected(kind, f"{host} resolves to no address") from None
    for addr in addrs:  # every answer must pass: a mixed answer is a rebinding setup
        cls = refusal(addr, pol.private_allowed(), pol.trusted_networks)
        if cls:
            raise _rejected(kind, f"{addr} is a {cls} address" if addr == host
                            else f"{host} resolves to {addr}, a {cls} address")
    ip = addrs[0]
    netloc = (f"[{ip}]" if ":" in ip else ip) + f":{port}"
    host_header = f"[{host}]" if ":" in host else host
    if port != (443 if scheme == "https" else 80):
        host_header += f":{port}"
    pinned = urlunsplit((scheme, netloc, parts.path or "/", parts.query, ""))
    return pinned, host_header, host


async def _fetch_remote(url: str, kind: str, pol: FetchPolicy) -> tuple[bytes, str | None]:
    import httpx

    limit = pol.limit(kind)
    timeout = httpx.Timeout(pol.timeout_s)
    async with httpx.AsyncClient(trust_env=False, follow_redirects=False,
                                 timeout=timeout) as client:
        for _hop in range(pol.max_redirects + 1):
            pinned, host_header, host = await _pin(url, kind, pol)
            req = client.build_request("GET", pinned, headers={"Host": host_header,
                                                                "Accept": f"{kind}/*, */*"},
                                       extensions={"sni_hostname": host})
            try:
                resp = await client.send(req, stream=True)
            except httpx.HTTPError as exc:
                raise MediaRejected(f"prompt build failed: could not fetch {kind} url: "
                                    f"{type(exc).__name__}: {exc}") from None
            try:
                if resp.is_redirect:
                    location = resp.headers.get("location")
                    if not location:
                        raise _rejected(kind, f"HTTP {resp.status_code} redirect without "
                                              "a Location")
                    url = urljoin(url, location)
                    continue
                if resp.status_code >= 400:
                    raise MediaRejected(f"prompt build failed: could not fetch {kind} url: "
                                        f"HTTP {resp.status_code}")
                return await _read_capped(resp, kind, limit), resp.headers.get("content-type")
            finally:
                await resp.aclose()
    raise _rejected(kind, f"more than {pol.max_redirects} redirects")


async def _read_capped(resp, kind: str, limit: int) -> bytes:
    declared = resp.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise _rejected(kind, f"response is {int(declared)} bytes; the cap is {limit // MB} MB")
    chunks, size = [], 0
    async for chunk in resp.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise _rejected(kind, f"response is over the {limit // MB} MB cap")
        chunks.append(chunk)
    return b"".join(chunks)
