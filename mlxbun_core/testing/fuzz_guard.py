"""Generated probes of the guard (issue #31), for the fuzz tests: every spelling of a route's
path a router or a proxy may read as that route (letter case, percent escapes, doubled and
trailing slashes, dot segments), the headers a page of another site sends (``Origin``,
a rebound ``Host``, ``Sec-Fetch-Site``), bodies not declared JSON, and chat frames with
fields of every type. The app's own router is the oracle for where a path lands
(:func:`routed`). Needs the ``test`` extra (hypothesis).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from . import fuzz

OTHER_SITES = ["http://evil.example", "https://evil.example", "null", "http://localhost:1",
               "http://127.0.0.1.evil.example", "http://[::1]:2", "file://", "evil"]
REBOUND_HOSTS = ["attacker.example", "attacker.example:8080", "localhost.evil.example",
                 "127.0.0.1.nip.io", "xn--80ak6aa92e.com"]
NOT_JSON = ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x", "text/json", "application/jsonx", "json", None]


def sample(pattern: str) -> str:
    """A path ``pattern`` (a route's) matches: parameters and tails filled in."""
    return "/".join("x1" if p.startswith(("{", ":", "<")) or p == "*" else p
                    for p in pattern.split("/"))


def routes(app, admin: bool | None = None) -> list[tuple[str, str]]:
    """``(method, sample path)`` of every HTTP route of ``app`` (only admin ones, only
    others, or all)."""
    rules = app.state.guard
    out = {(m.decode(), sample(r.pattern.decode())) for m, rs in app.router.routes.items()
           for r in rs if m != b"GET_WS"
           and (admin is None or rules.is_admin(r.pattern.decode()) == admin)}
    return sorted(out)


def routed(app, method: str, raw_path: str) -> bool:
    """Whether BlackSheep hands ``method raw_path`` to a route's handler (not its
    fallback)."""
    match = app.router.get_match_by_method_and_path(method, raw_path.encode())
    return match is not None and match.pattern != b"*"


@st.composite
def spelling(draw, path: str) -> str:
    """``path`` with a few of: letters in other cases, a letter percent-escaped, a slash
    doubled or escaped, a trailing slash, a dot segment."""
    chars = list(path)
    for i in draw(st.lists(st.integers(0, len(chars) - 1), max_size=6)):
        chars[i] = chars[i].swapcase()
    out = "".join(chars)
    for _ in range(draw(st.integers(0, 2))):
        edit = draw(st.sampled_from(["escape", "slash", "escaped-slash", "dot", "dotdot",
                                     "trailing"]))
        cut = draw(st.integers(1, max(1, len(out) - 1)))
        if edit == "escape" and out[cut].isalnum():
            hexed = f"%{ord(out[cut]):02x}"
            out = out[:cut] + (hexed.upper() if draw(st.booleans()) else hexed) + out[cut + 1:]
        elif edit == "slash":
            out = out[:cut] + "/" + out[cut:]
        elif edit == "escaped-slash" and "/" in out[1:]:
            out = out[0] + out[1:].replace("/", draw(st.sampled_from(["%2F", "%2f"])), 1)
        elif edit == "dot":
            out = "/." + out
        elif edit == "dotdot":
            out = "/zz/.." + out
        elif edit == "trailing":
            out += "/"
    return out


@st.composite
def foreign(draw) -> dict[str, str]:
    """Headers of a page of another site: an ``Origin`` of another site, a rebound
    ``Host``, or a cross-site fetch's ``Sec-Fetch-Site`` without ``Origin``."""
    kind = draw(st.sampled_from(["origin", "host", "fetch-site"]))
    if kind == "origin":
        return {"Origin": draw(st.sampled_from(OTHER_SITES))}
    if kind == "host":
        return {"Host": draw(st.sampled_from(REBOUND_HOSTS))}
    return {"Sec-Fetch-Site": draw(st.sampled_from(["cross-site", "same-site"]))}


@st.composite
def chat_frame(draw, fields: dict[str, tuple], required: dict[str, tuple]) -> dict[str, Any]:
    """A chat frame of a known type (``webchat.frames.FIELDS``) whose fields take any value
    from the fuzz edges, the required ones mostly present. Never a turn (they are slow) nor
    ``new_session`` (the open session stays open, so the session frames reach the store)."""
    kind = draw(st.sampled_from(sorted(set(fields) - {"prompt", "edit_resend", "regenerate",
                                                      "new_session"})))
    names = list(fields[kind]) + ["type2", "extra"]
    frame: dict[str, Any] = {"type": kind}
    for name in draw(st.lists(st.sampled_from(names), max_size=4, unique=True)):
        frame[name] = draw(fuzz.values)
    if kind == "set_coding_tools" and frame.get("enabled") is True:
        frame["workspace"] = draw(st.sampled_from(["", "x", "/nonexistent/zz", 5, None]))
    for name in required.get(kind, ()):
        if draw(st.integers(0, 3)) and name not in frame:
            frame[name] = draw(fuzz.values)
    return frame


def raw_request(host: str, port: int, method: str, target: str,
                headers: dict[str, str] | None = None, body: bytes = b"") -> tuple[int, bytes]:
    """One HTTP/1.1 request with exactly this request line and these headers (no client
    library normalizes the path); ``(status, body)`` of the answer. A ``Host`` in
    ``headers`` replaces the real one."""
    import socket

    sent = {"Host": f"{host}:{port}", "Connection": "close",
            "Content-Length": str(len(body)), **(headers or {})}
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in sent.items())
    with socket.create_connection((host, port), timeout=60) as s:
        s.sendall(head.encode("latin-1") + b"\r\n" + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), rest
