"""Remote media fetching under the media policy (``mlxcore_vision.fetch``).

Real sockets and real HTTP(S) servers on 127.0.0.1; only name resolution (and, where a
"public" host has to be reachable, the dialling of its made-up address) is injected.
"""

from __future__ import annotations

import datetime
import http.server
import io
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from mlxcore.errors import MediaError
from mlxcore_vision.fetch import FetchError, fetch_media, is_public
from mlxcore_vision.media import MediaPolicy, VisionMedia

PUBLIC_IP = "93.184.216.34"  # a global address; never actually dialled except where noted


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 3), (10, 200, 30)).save(out, "PNG")
    return out.getvalue()


PNG = _png()


class Origin:
    """A real HTTP server on 127.0.0.1 that records the path and Host of each request.

    Routes: ``/image.png`` (the PNG), ``/big`` (1000 bytes with a Content-Length),
    ``/big-stream`` (1000 bytes without one), ``/redirect?to=URL[&status=N]``,
    ``/chain/N`` (N relative redirects, then the PNG); anything else is a 404.
    """

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.requests: list[tuple[str, str | None]] = []
        origin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                origin.requests.append((self.path, self.headers.get("Host")))
                url = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                if url.path == "/image.png":
                    self._send(200, PNG)
                elif url.path == "/big":
                    self._send(200, b"x" * 1000)
                elif url.path == "/big-stream":
                    self.send_response(200)
                    self.end_headers()  # HTTP/1.0: the body runs until the connection closes
                    self.wfile.write(b"x" * 1000)
                elif url.path == "/redirect":
                    self._redirect(int(query.get("status", "302")), query["to"])
                elif url.path.startswith("/chain/"):
                    left = int(url.path.rsplit("/", 1)[1])
                    self._redirect(302, f"{left - 1}" if left > 1 else "/image.png")
                else:
                    self._send(404, b"not here")

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _redirect(self, status: int, location: str) -> None:
                self.send_response(status)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port: int = self.server.server_address[1]
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Resolver:
    """A fake DNS: ``answers[host]`` is a list of answers, one per call (the last one
    repeats); every call is recorded."""

    def __init__(self, **answers: list[list[str]]) -> None:
        self.answers = {host.replace("_", "."): a for host, a in answers.items()}
        self.calls: list[str] = []

    def __call__(self, host: str) -> list[str]:
        self.calls.append(host)
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        answers = self.answers[host]
        return answers[min(len(self.calls_for(host)), len(answers)) - 1]

    def calls_for(self, host: str) -> list[str]:
        return [h for h in self.calls if h == host]


class Network:
    """A connector that records every address dialled and routes the made-up public
    address :data:`PUBLIC_IP` to a local port (``None``: refuse it)."""

    def __init__(self, public_port: int | None = None) -> None:
        self.public_port = public_port
        self.dialled: list[tuple[str, int]] = []

    def __call__(self, address: tuple[str, int], timeout: float) -> socket.socket:
        self.dialled.append(address)
        if address[0] == PUBLIC_IP:
            if self.public_port is None:
                raise ConnectionRefusedError("unreachable (test network)")
            return socket.create_connection(("127.0.0.1", self.public_port), timeout)
        return socket.create_connection(address, timeout)


@pytest.fixture
def serve() -> Iterator[Any]:
    """``serve(tls=None) -> Origin``: start servers, all closed after the test."""
    started: list[Origin] = []

    def start(tls: ssl.SSLContext | None = None) -> Origin:
        started.append(Origin(tls))
        return started[-1]

    yield start
    for origin in started:
        origin.close()


def fetch(url: str, resolver: Resolver, **kw: Any) -> bytes:
    options: dict[str, Any] = {
        "allowed_domains": ("media.test",),
        "allow_private": True,
        "timeout": 5.0,
        "max_bytes": 32 * 1024 * 1024,
    }
    options.update(kw)
    return fetch_media(url, resolver=resolver, **options)


def test_allowed_host_is_fetched_with_its_hostname(serve: Any) -> None:
    origin = serve()
    dns = Resolver(media_test=[["127.0.0.1"]])
    assert fetch(f"http://media.test:{origin.port}/image.png", dns) == PNG
    assert origin.requests == [("/image.png", f"media.test:{origin.port}")]
    assert dns.calls == ["media.test"]


def test_subdomains_match_but_lookalikes_do_not(serve: Any) -> None:
    origin = serve()
    dns = Resolver(cdn_media_test=[["127.0.0.1"]], evilmedia_test=[["127.0.0.1"]])
    assert fetch(f"http://cdn.media.test:{origin.port}/image.png", dns) == PNG
    with pytest.raises(FetchError, match=r"host 'evilmedia\.test' is not allowed"):
        fetch(f"http://evilmedia.test:{origin.port}/image.png", dns)
    assert dns.calls == ["cdn.media.test"]


def test_the_connection_goes_to_the_address_that_was_checked(serve: Any) -> None:
    """A second lookup would give an unroutable address; the fetch succeeds only
    because the connection uses the first (and only) answer."""
    origin = serve()
    dns = Resolver(media_test=[["127.0.0.1"], ["192.0.2.1"]])
    assert fetch(f"http://media.test:{origin.port}/image.png", dns) == PNG
    assert dns.calls == ["media.test"]


def test_dns_rebinding_never_reaches_the_local_server(serve: Any) -> None:
    """Public for the check, loopback afterwards: the fetch dials the public address
    (unreachable here) and never the local server."""
    internal = serve()
    dns = Resolver(media_test=[[PUBLIC_IP], ["127.0.0.1"]])
    url = f"http://media.test:{internal.port}/image.png"
    with pytest.raises(FetchError, match="could not fetch"):
        fetch(url, dns, allow_private=False, timeout=0.5, connector=Network())
    assert internal.requests == []
    assert dns.calls == ["media.test"]
    # the same with the real default connector (the public address fails or times out)
    dns = Resolver(media_test=[[PUBLIC_IP], ["127.0.0.1"]])
    with pytest.raises(FetchError, match="could not fetch"):
        fetch(url, dns, allow_private=False, timeout=0.5)
    assert internal.requests == []
    assert dns.calls == ["media.test"]


def test_dns_rebinding_gets_the_public_server(serve: Any) -> None:
    public, internal = serve(), serve()
    dns = Resolver(media_test=[[PUBLIC_IP], ["127.0.0.1"]])
    net = Network(public_port=public.port)
    url = f"http://media.test:{internal.port}/image.png"
    assert fetch(url, dns, allow_private=False, connector=net) == PNG
    assert net.dialled == [(PUBLIC_IP, internal.port)]
    assert internal.requests == [] and len(public.requests) == 1
    assert dns.calls == ["media.test"]


def test_any_non_public_address_is_refused(serve: Any) -> None:
    origin = serve()
    dns = Resolver(media_test=[[PUBLIC_IP, "127.0.0.1"]])
    net = Network(public_port=origin.port)
    with pytest.raises(FetchError, match="resolves to a non-public address"):
        fetch(f"http://media.test:{origin.port}/image.png", dns, allow_private=False, connector=net)
    assert net.dialled == [] and origin.requests == []


def test_ipv4_mapped_loopback_is_refused(serve: Any) -> None:
    origin = serve()
    dns = Resolver(media_test=[["::ffff:127.0.0.1"]])
    with pytest.raises(FetchError, match="non-public"):
        fetch(f"http://media.test:{origin.port}/image.png", dns, allow_private=False)
    assert origin.requests == []


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("169.254.169.254", False),
        ("0.0.0.0", False),
        ("::1", False),
        ("fe80::1", False),
        ("fd00::1", False),
        ("::ffff:127.0.0.1", False),
        ("::ffff:169.254.169.254", False),
        ("::ffff:10.0.0.1", False),
        ("64:ff9b::7f00:1", False),
        ("2002:7f00:1::", False),
        ("not-an-address", False),
        (PUBLIC_IP, True),
        ("::ffff:" + PUBLIC_IP, True),
        ("2606:4700:4700::1111", True),
    ],
)
def test_is_public(address: str, public: bool) -> None:
    assert is_public(address) is public


def test_redirect_outside_the_allowlist_is_refused(serve: Any) -> None:
    origin, target = serve(), serve()
    dns = Resolver(media_test=[["127.0.0.1"]], outside_test=[["127.0.0.1"]])
    to = f"http://outside.test:{target.port}/image.png"
    with pytest.raises(FetchError, match=r"host 'outside\.test' is not allowed"):
        fetch(f"http://media.test:{origin.port}/redirect?to={urllib.parse.quote(to)}", dns)
    assert target.requests == [] and len(origin.requests) == 1
    assert dns.calls == ["media.test"]


def test_redirect_to_a_private_address_is_refused(serve: Any) -> None:
    public, internal = serve(), serve()
    dns = Resolver(media_test=[[PUBLIC_IP]], internal_media_test=[["127.0.0.1"]])
    net = Network(public_port=public.port)
    to = f"http://internal.media.test:{internal.port}/image.png"
    url = f"http://media.test:{public.port}/redirect?status=307&to={urllib.parse.quote(to)}"
    with pytest.raises(FetchError, match=r"'internal\.media\.test' resolves to a non-public"):
        fetch(url, dns, allow_private=False, connector=net)
    assert internal.requests == [] and len(public.requests) == 1
    assert net.dialled == [(PUBLIC_IP, public.port)]
    assert dns.calls == ["media.test", "internal.media.test"]


def test_redirect_to_a_private_ip_literal_is_refused(serve: Any) -> None:
    public, internal = serve(), serve()
    dns = Resolver(media_test=[[PUBLIC_IP]])
    net = Network(public_port=public.port)
    to = f"http://127.0.0.1:{internal.port}/image.png"
    url = f"http://media.test:{public.port}/redirect?to={urllib.parse.quote(to)}"
    with pytest.raises(FetchError, match=r"host '127\.0\.0\.1' is not allowed"):
        fetch(url, dns, allow_private=False, connector=net)
    both = ("media.test", "127.0.0.1")  # even when the literal is an allowed "domain"
    with pytest.raises(FetchError, match=r"host '127\.0\.0\.1' resolves to a non-public"):
        fetch(url, dns, allowed_domains=both, allow_private=False, connector=net)
    assert internal.requests == [] and len(public.requests) == 2
    assert net.dialled == [(PUBLIC_IP, public.port)] * 2


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_redirects_are_followed_and_each_hop_resolved_once(serve: Any, status: int) -> None:
    first, second = serve(), serve()
    dns = Resolver(media_test=[["127.0.0.1"]], cdn_media_test=[["127.0.0.1"]])
    to = f"http://cdn.media.test:{second.port}/image.png"
    url = f"http://media.test:{first.port}/redirect?status={status}&to={urllib.parse.quote(to)}"
    assert fetch(url, dns) == PNG
    assert second.requests == [("/image.png", f"cdn.media.test:{second.port}")]
    assert dns.calls == ["media.test", "cdn.media.test"]


def test_three_redirects_are_followed_but_not_four(serve: Any) -> None:
    origin = serve()
    dns = Resolver(media_test=[["127.0.0.1"]])
    assert fetch(f"http://media.test:{origin.port}/chain/3", dns) == PNG
    assert [path for path, _ in origin.requests] == [
        "/chain/3",
        "/chain/2",
        "/chain/1",
        "/image.png",
    ]
    assert dns.calls == ["media.test"] * 4
    origin.requests.clear()
    with pytest.raises(FetchError, match="too many redirects"):
        fetch(f"http://media.test:{origin.port}/chain/4", dns)
    assert [path for path, _ in origin.requests] == ["/chain/4", "/chain/3", "/chain/2", "/chain/1"]


def test_redirect_to_another_scheme_is_refused(serve: Any) -> None:
    origin = serve()
    dns = Resolver(media_test=[["127.0.0.1"]])
    url = f"http://media.test:{origin.port}/redirect?to=file:///etc/passwd"
    with pytest.raises(FetchError, match="scheme 'file' is not allowed"):
        fetch(url, dns)


@pytest.mark.parametrize("path", ["/big", "/big-stream"])
def test_a_body_over_the_limit_is_refused(serve: Any, path: str) -> None:
    origin = serve()
    dns = Resolver(media_test=[["127.0.0.1"]])
    url = f"http://media.test:{origin.port}{path}"
    with pytest.raises(FetchError, match="the media file is larger than 100 bytes"):
        fetch(url, dns, max_bytes=100)
    assert fetch(url, dns, max_bytes=1000) == b"x" * 1000


def test_http_errors_and_unknown_hosts(serve: Any) -> None:
    origin = serve()
    dns = Resolver(media_test=[["127.0.0.1"]], empty_media_test=[[]])
    with pytest.raises(FetchError, match="could not fetch the media: HTTP 404"):
        fetch(f"http://media.test:{origin.port}/missing.png", dns)
    for host in ("nowhere.media.test", "empty.media.test"):
        with pytest.raises(FetchError, match=f"cannot resolve media URL host '{host}'"):
            fetch(f"http://{host}:{origin.port}/image.png", dns)
    with pytest.raises(FetchError, match="could not fetch"):
        fetch("http://media.test:1/image.png", dns)  # nothing listens on port 1


def _tls(tmp_path: Path, name: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a self-signed certificate for ``name``, and a client
    context that trusts only it (hostname checks on, as by default)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert_file, key_file)
    return server, ssl.create_default_context(cafile=str(cert_file))


def test_https_checks_the_certificate_against_the_hostname(serve: Any, tmp_path: Path) -> None:
    server_tls, client_tls = _tls(tmp_path, "media.test")
    origin = serve(tls=server_tls)
    dns = Resolver(media_test=[["127.0.0.1"]], other_test=[["127.0.0.1"]])
    url = f"https://media.test:{origin.port}/image.png"
    assert fetch(url, dns, context=client_tls) == PNG
    assert origin.requests == [("/image.png", f"media.test:{origin.port}")]
    other = f"https://other.test:{origin.port}/image.png"  # same server, same address
    with pytest.raises(FetchError, match=r"could not fetch.*(hostname|match)"):
        fetch(other, dns, allowed_domains=("other.test",), context=client_tls)
    with pytest.raises(FetchError, match=r"could not fetch.*CERTIFICATE_VERIFY_FAILED"):
        fetch(url, dns)  # the system's authorities do not know this certificate
    assert len(origin.requests) == 1


def test_vision_media_turns_fetch_errors_into_400s(serve: Any) -> None:
    """Through the server's handler, with the real resolver: ``localhost`` is loopback."""
    origin = serve()
    allowed = MediaPolicy(allowed_domains=("localhost",), allow_private=True)
    handler = VisionMedia("qwen2_vl", None, None, allowed)
    assert handler.fetch(f"http://localhost:{origin.port}/image.png", "m[0]") == PNG
    with pytest.raises(MediaError, match="could not fetch the media: HTTP 404") as err:
        handler.fetch(f"http://localhost:{origin.port}/missing.png", "m[0]")
    assert err.value.field == "m[0].image_url"
    strict = VisionMedia("qwen2_vl", None, None, MediaPolicy(allowed_domains=("localhost",)))
    with pytest.raises(MediaError, match="non-public address"):
        strict.fetch(f"http://localhost:{origin.port}/image.png", "m[0]")
    assert len(origin.requests) == 2
