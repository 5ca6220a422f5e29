"""The media fetcher's destination policy against real local HTTP servers.

Each refused URL must be answered with a 400 ``… url rejected: …`` AND leave the
server that would have answered it without a single request.
"""

import asyncio
import base64
import time

import pytest

from mlxbun_core.errors import BadRequest
from mlxbun_core.media import fetch as F
from mlxbun_core.testing.media_server import MediaServer, redirect, slow

PNG = b"\x89PNG\r\n\x1a\n" + b"x" * 100


def run(coro):
    return asyncio.run(coro)


def resolver(table):
    async def resolve(host, port):
        answer = table[host]
        return answer() if callable(answer) else list(answer)
    return resolve


@pytest.fixture
def lo():
    with MediaServer("127.0.0.1", {"/img.png": (200, {"Content-Type": "image/png"}, PNG)}) as s:
        yield s


@pytest.fixture
def lo2():
    """A second loopback address the tests mark trusted: it plays the public host."""
    with MediaServer("127.0.0.2", {"/img.png": (200, {"Content-Type": "image/png"}, PNG)}) as s:
        yield s


def trusted(**kw):
    return F.FetchPolicy(trusted_networks=("127.0.0.2/32",), **kw)


def rejected(url, pol, match="url rejected"):
    with pytest.raises(BadRequest, match=match) as info:
        run(F.fetch(url, "image", pol))
    assert info.value.status == 400
    assert info.value.message.startswith("prompt build failed: ")
    return info.value.message


def test_loopback_ipv4_refused_without_a_request(lo):
    msg = rejected(lo.url("/img.png"), F.FetchPolicy())
    assert "127.0.0.1 is a loopback address" in msg
    assert lo.requests == []


def test_loopback_ipv6_refused_without_a_request():
    with MediaServer("::1", {"/img.png": (200, {}, PNG)}) as v6:
        rejected(v6.url("/img.png"), F.FetchPolicy(), "loopback")
        assert v6.requests == []
        # and the opt-in reaches it, so the refusal above was the policy, not the network
        data, _ = run(F.fetch(v6.url("/img.png"), "image", F.FetchPolicy(allow_private=True)))
        assert data == PNG and len(v6.requests) == 1


def test_link_local_metadata_address_refused():
    # nothing listens there: a policy refusal answers at once, a connect attempt would not
    t = time.monotonic()
    msg = rejected("http://169.254.169.254/latest/meta-data/", F.FetchPolicy())
    assert "169.254.169.254 is a link-local address" in msg
    assert time.monotonic() - t < 1.0


def test_hostname_resolving_to_private_address_refused(lo):
    pol = F.FetchPolicy(resolver=resolver({"media.example": ["127.0.0.1"]}))
    msg = rejected(lo.url("/img.png", host="media.example"), pol)
    assert "media.example resolves to 127.0.0.1, a loopback address" in msg
    assert lo.requests == []
    pol = F.FetchPolicy(resolver=resolver({"nas.example": ["10.1.2.3"]}))
    assert "private address" in rejected("http://nas.example/a.png", pol)


def test_allow_private_lets_lan_hosts_through(lo):
    pol = F.FetchPolicy(allow_private=True, resolver=resolver({"media.example": ["127.0.0.1"]}))
    data, ctype = run(F.fetch(lo.url("/img.png", host="media.example"), "image", pol))
    assert data == PNG and ctype == "image/png"
    (path, headers), = lo.requests
    assert path == "/img.png" and headers["Host"] == f"media.example:{lo.port}"


def test_redirect_to_loopback_refused(lo, lo2):
    lo2.routes["/hop"] = redirect(lo.url("/img.png"))
    msg = rejected(lo2.url("/hop"), trusted())
    assert "127.0.0.1 is a loopback address" in msg
    assert [p for p, _ in lo2.requests] == ["/hop"] and lo.requests == []


def test_redirect_to_hostname_resolving_private_refused(lo, lo2):
    lo2.routes["/hop"] = redirect(f"http://inside.example:{lo.port}/img.png")
    pol = trusted(resolver=resolver({"inside.example": ["127.0.0.1"]}))
    assert "inside.example resolves to 127.0.0.1" in rejected(lo2.url("/hop"), pol)
    assert lo.requests == []


def test_allowed_redirect_is_followed(lo2):
    lo2.routes["/hop"] = redirect("/img.png", 301)
    data, _ = run(F.fetch(lo2.url("/hop"), "image", trusted()))
    assert data == PNG and [p for p, _ in lo2.requests] == ["/hop", "/img.png"]


def test_too_many_redirects(lo2):
    lo2.routes["/loop"] = redirect("/loop")
    assert "redirects" in rejected(lo2.url("/loop"), trusted(max_redirects=3))
    assert len(lo2.requests) == 4


def test_connects_to_the_address_that_was_checked(lo, lo2):
    """A resolver that answers a trusted address first and loopback afterwards (DNS
    rebinding) still only ever reaches the checked address."""
    answers = iter([["127.0.0.2"], ["127.0.0.1"], ["127.0.0.1"]])
    pol = trusted(resolver=resolver({"rebind.example": lambda: next(answers)}))
    data, _ = run(F.fetch(f"http://rebind.example:{lo2.port}/img.png", "image", pol))
    assert data == PNG
    (_, headers), = lo2.requests
    assert headers["Host"] == f"rebind.example:{lo2.port}"
    assert lo.requests == []


def test_mixed_answer_with_one_private_address_refused(lo2):
    pol = trusted(resolver=resolver({"mixed.example": ["127.0.0.2", "127.0.0.1"]}))
    assert "127.0.0.1, a loopback" in rejected(f"http://mixed.example:{lo2.port}/img.png", pol)
    assert lo2.requests == []


@pytest.mark.parametrize("addr,cls", [
    ("::ffff:127.0.0.1", "loopback"),      # IPv4-mapped
    ("::ffff:10.0.0.1", "private"),
    ("2002:7f00:1::1", "loopback"),        # 6to4 around 127.0.0.1
    ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 around 169.254.169.254
    ("fe80::1", "link-local"),
    ("fc00::1", "private"),
    ("0.0.0.0", "unspecified"),
    ("::", "unspecified"),
    ("224.0.0.1", "multicast"),
    ("ff02::1", "multicast"),
    ("100.64.0.1", "shared (CGNAT)"),
    ("192.168.1.10", "private"),
    ("240.0.0.1", "reserved"),
])
def test_address_classes(addr, cls):
    assert F.address_class(addr) == cls
    literal = f"[{addr}]" if ":" in addr else addr
    assert cls in rejected(f"http://{literal}/x.png", F.FetchPolicy())


def test_public_addresses_pass_the_check():
    for addr in ("8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"):
        assert F.address_class(addr) is None


def test_allow_private_still_refuses_non_unicast():
    for addr in ("0.0.0.0", "224.0.0.1", "240.0.0.1"):
        assert F.refusal(addr, allow_private=True) is not None
    for addr in ("127.0.0.1", "10.0.0.1", "169.254.169.254", "::1", "100.64.0.1"):
        assert F.refusal(addr, allow_private=True) is None


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://8.8.8.8/x.png",
                                 "gopher://8.8.8.8/", "//8.8.8.8/x.png", "http:///x.png",
                                 "http://user:pw@8.8.8.8/x.png"])
def test_bad_schemes_and_shapes(url):
    rejected(url, F.FetchPolicy())


def test_size_cap_by_content_length_and_while_streaming(lo2):
    lo2.routes["/big"] = (200, {}, b"x" * 5000)
    lo2.routes["/chunked"] = lambda s, h: (200, {"Transfer-Encoding": "chunked", "_chunked": 1},
                                           b"1388\r\n" + b"x" * 5000 + b"\r\n0\r\n\r\n")
    pol = trusted(size_limits={"image": 4000})
    assert "cap" in rejected(lo2.url("/big"), pol)
    assert "cap" in rejected(lo2.url("/chunked"), pol)
    data, _ = run(F.fetch(lo2.url("/chunked"), "image", trusted()))
    assert len(data) == 5000
    assert F.SIZE_LIMITS == {"image": 64 << 20, "audio": 64 << 20, "video": 256 << 20}


def test_timeout(lo2):
    lo2.routes["/slow"] = slow(3)
    t = time.monotonic()
    rejected(lo2.url("/slow"), trusted(timeout_s=0.5), "timed out")
    assert time.monotonic() - t < 2.5


def test_http_errors_are_400s(lo2):
    assert "HTTP 404" in rejected(lo2.url("/missing"), trusted(), "could not fetch")


def test_unresolvable_host():
    async def fail(host, port):
        raise OSError("no such host")
    refusal = rejected("http://nowhere.invalid/x.png", F.FetchPolicy(resolver=fail))
    assert "cannot resolve" in refusal


def test_data_urls_decode_locally():
    b64 = base64.b64encode(PNG).decode()
    assert run(F.fetch(f"data:image/png;base64,{b64}", "image")) == (PNG, "image/png")
    wrapped = "\n".join(b64[i:i + 20] for i in range(0, len(b64), 20)).rstrip("=")
    assert run(F.fetch(f"data:image/png;base64,{wrapped}", "image"))[0] == PNG
    assert run(F.fetch("data:,hello%20there", "image"))[0] == b"hello there"
    for bad in ("data:image/png;base64", "data:image/png;base64,@@@@", "data:image/png;base64,"):
        with pytest.raises(BadRequest, match="data URL"):
            run(F.fetch(bad, "image"))


def test_data_url_size_cap():
    pol = F.FetchPolicy(size_limits={"image": 10})
    with pytest.raises(BadRequest, match="over"):
        run(F.fetch("data:;base64," + base64.b64encode(b"x" * 100).decode(), "image", pol))
