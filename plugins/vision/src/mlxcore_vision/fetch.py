"""Fetching remote media without letting a URL reach into the server's own network.

A media URL comes from the client, so the server must not fetch just anything it names
(server-side request forgery). :func:`fetch_media` enforces the media policy on every
hop of the request, not only on the URL it was given:

* the scheme must be ``http`` or ``https`` and the host must be an allowed domain (equal
  to one, or a subdomain of one);
* the host is resolved exactly once and every address it resolves to must be public
  (unless private addresses are allowed); the connection then goes to one of those
  vetted addresses, never to a second lookup of the name, so a DNS server that answers
  differently the second time (DNS rebinding) cannot redirect it. The ``Host`` header,
  and for https the TLS server name the certificate is checked against, stay the
  hostname;
* redirects (at most :data:`MAX_REDIRECTS`) are followed by hand, each new URL checked
  exactly like the first;
* the body may not exceed ``max_bytes``.

Every refusal or failure is a :class:`FetchError` whose message is meant for the user.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import urllib.parse
from collections.abc import Callable, Sequence
from typing import NamedTuple

Resolver = Callable[[str], Sequence[str]]
"""``host -> addresses``: the IP addresses (as strings) a hostname resolves to."""

Connector = Callable[[tuple[str, int], float], socket.socket]
"""``((ip, port), timeout) -> connected socket`` (:func:`socket.create_connection`)."""

MAX_REDIRECTS = 3
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_CHUNK = 64 * 1024


class FetchError(Exception):
    """A remote media fetch was refused or failed; ``str(error)`` says why."""


class _Hop(NamedTuple):
    """One vetted request: where to send it and the addresses it may go to."""

    https: bool
    host: str
    port: int
    target: str
    addresses: list[str]


def resolve(host: str) -> list[str]:
    """Every address ``host`` resolves to (:func:`socket.getaddrinfo`), in its order."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def is_public(address: str) -> bool:
    """Whether ``address`` is a globally routable IP address.

    IPv6 forms that embed an IPv4 address (IPv4-mapped ``::ffff:a.b.c.d``, 6to4 and the
    NAT64 well-known prefix) are judged by that IPv4 address, so ``::ffff:127.0.0.1``
    counts as loopback. Anything that is not an IP address is not public.
    """
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        elif ip.sixtofour is not None:
            ip = ip.sixtofour
        elif ip in _NAT64:
            ip = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.is_global


def host_allowed(host: str, allowed_domains: Sequence[str]) -> bool:
    """Whether ``host`` is one of ``allowed_domains`` or a subdomain of one."""
    return bool(host) and any(host == d or host.endswith("." + d) for d in allowed_domains)


def fetch_media(
    url: str,
    *,
    allowed_domains: Sequence[str],
    allow_private: bool,
    timeout: float,
    max_bytes: int,
    resolver: Resolver = resolve,
    connector: Connector = socket.create_connection,
    context: ssl.SSLContext | None = None,
    max_redirects: int = MAX_REDIRECTS,
) -> bytes:
    """The body of a ``GET url``, following redirects, under the media policy.

    Args:
        url: an ``http`` or ``https`` URL.
        allowed_domains: lower-case domains the URL (and every redirect) may point at.
        allow_private: also allow non-public (private, loopback, link-local...) addresses.
        timeout: seconds allowed for each connection attempt and each socket read.
        max_bytes: the largest body accepted.
        resolver: resolves each hop's host, once per hop (tests inject their own).
        connector: opens the TCP connection to a vetted address.
        context: the TLS context for https (default: certificate and hostname checks
            against the system's trusted authorities).
        max_redirects: how many redirects to follow.

    Raises:
        FetchError: the URL or a redirect is not allowed, or the fetch failed.
    """
    for _hop in range(max_redirects + 1):
        hop = _vet(url, allowed_domains, allow_private, resolver)
        status, reason, location, body = _get(hop, timeout, max_bytes, connector, context)
        if status in REDIRECT_STATUSES:
            if not location:
                raise FetchError(f"could not fetch the media: HTTP {status} without a Location")
            url = urllib.parse.urljoin(url, location)
            continue
        if not 200 <= status < 300:
            raise FetchError(f"could not fetch the media: HTTP {status} {reason}".rstrip())
        return body
    raise FetchError(f"could not fetch the media: too many redirects (more than {max_redirects})")


def _vet(url: str, allowed_domains: Sequence[str], allow_private: bool, resolver: Resolver) -> _Hop:
    """The request for ``url`` and the addresses it may go to, or a :class:`FetchError`."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise FetchError(f"media URL scheme {scheme!r} is not allowed: only http and https")
    host = (parts.hostname or "").lower()
    if not host_allowed(host, allowed_domains):
        raise FetchError(f"media URL host {host!r} is not allowed (--allowed-media-domains)")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise FetchError(f"the media URL has an invalid port: {url!r}") from None
    if _is_ip(host):
        addresses = [host]
    else:
        try:
            addresses = [str(a) for a in resolver(host)]
        except (OSError, UnicodeError):
            addresses = []
        if not addresses:
            raise FetchError(f"cannot resolve media URL host {host!r}")
    if not allow_private and not all(is_public(a) for a in addresses):
        raise FetchError(f"media URL host {host!r} resolves to a non-public address")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Hop(scheme == "https", host, port, target, addresses)


def _get(
    hop: _Hop,
    timeout: float,
    max_bytes: int,
    connector: Connector,
    context: ssl.SSLContext | None,
) -> tuple[int, str, str | None, bytes]:
    """One ``GET``: status, reason, ``Location`` and (for a 2xx) the body."""
    conn: http.client.HTTPConnection
    if hop.https:
        ctx = context or ssl.create_default_context()
        conn = _PinnedHTTPSConnection(hop.host, hop.port, hop.addresses, connector, timeout, ctx)
    else:
        conn = _PinnedHTTPConnection(hop.host, hop.port, hop.addresses, connector, timeout)
    try:
        conn.request("GET", hop.target, headers={"Accept": "*/*", "Connection": "close"})
        resp = conn.getresponse()
        body = b""
        if 200 <= resp.status < 300:
            length = resp.getheader("Content-Length")
            if length and length.strip().isdigit() and int(length) > max_bytes:
                raise FetchError(f"the media file is larger than {_size(max_bytes)}")
            body = _read_limited(resp, max_bytes)
        return resp.status, resp.reason, resp.getheader("Location"), body
    except FetchError:
        raise
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise FetchError(f"could not fetch the media: {exc}") from None
    finally:
        conn.close()


def _read_limited(resp: http.client.HTTPResponse, max_bytes: int) -> bytes:
    """The response body, or a :class:`FetchError` once it passes ``max_bytes``."""
    chunks: list[bytes] = []
    total = 0
    while chunk := resp.read(min(_CHUNK, max_bytes + 1 - total)):
        chunks.append(chunk)
        total += len(chunk)
        if total > max_bytes:
            raise FetchError(f"the media file is larger than {_size(max_bytes)}")
    return b"".join(chunks)


def _size(n: int) -> str:
    mib = 1024 * 1024
    return f"{n // mib} MiB" if n >= mib and n % mib == 0 else f"{n} bytes"


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection to ``host`` that dials only the already vetted ``addresses``
    (in order, the first that accepts), never resolving the name again."""

    def __init__(
        self,
        host: str,
        port: int,
        addresses: list[str],
        connector: Connector,
        timeout: float,
    ) -> None:
        super().__init__(host, port, timeout=timeout)
        self._addresses = addresses
        self._connector = connector
        self._dial_timeout = timeout

    def connect(self) -> None:
        """Open the TCP connection to the first vetted address that accepts it."""
        error: OSError | None = None
        for address in self._addresses:
            try:
                self.sock = self._connector((address, self.port), self._dial_timeout)
                return
            except OSError as exc:
                error = exc
        raise error or OSError("no address to connect to")


class _PinnedHTTPSConnection(_PinnedHTTPConnection):
    """:class:`_PinnedHTTPConnection` over TLS; the certificate is verified against the
    hostname (``server_hostname``), not the address dialled."""

    default_port = http.client.HTTPS_PORT

    def __init__(
        self,
        host: str,
        port: int,
        addresses: list[str],
        connector: Connector,
        timeout: float,
        context: ssl.SSLContext,
    ) -> None:
        super().__init__(host, port, addresses, connector, timeout)
        self._context = context

    def connect(self) -> None:
        """Connect to a vetted address, then wrap the socket in TLS for the hostname."""
        super().connect()
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self.host)
