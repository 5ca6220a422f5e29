"""Reading a request's JSON body: every malformed body is a 4xx, never a crash.

Checked before Python's recursive JSON decoder and everything after it sees the
body: its size (413 past a byte cap, read no further), its content type (415 unless
JSON: a ``text/plain`` or form POST is what a page of another site may send without a
CORS preflight), its nesting depth, UTF-8, strict JSON (no NaN/Infinity, no float
overflowing to inf), an object at the top and no unpaired UTF-16 surrogate in any string.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, NoReturn

import numpy as np
from blacksheep import Request
from blacksheep.exceptions import MessageAborted

from ..errors import APIError, BadRequest
from ..runconfig import current

DEFAULT_MAX_BYTES = 32 * 1024 * 1024  # Anthropic's own Messages cap; room for inline images
MAX_DEPTH = 64  # far beyond any real body (a JSON schema nests a few levels per property)

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_CHUNK = 1 << 20
_JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "a boolean", type(None): "null"}


def max_body_bytes() -> int:
    """The byte cap: the run configuration's (``MLXBUN_MAX_BODY_BYTES``), else 32 MiB."""
    return current().server.max_body_bytes or DEFAULT_MAX_BYTES


class BodyTooLarge(APIError):
    status = 413
    type = "invalid_request_error"

    def __init__(self, limit: int):
        super().__init__(f"request body is larger than {limit} bytes "
                         "(MLXBUN_MAX_BODY_BYTES raises the cap)", code="request_too_large")


async def _read_capped(request: Request, limit: int) -> bytes:
    declared = request.get_first_header(b"content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)  # answered before a byte of it is read
    content = request.content
    if content is None:
        return b""
    if content.body is not None:  # read already (streaming it again would wait forever)
        if len(content.body) > limit:
            raise BodyTooLarge(limit)
        return content.body
    data = bytearray()
    try:
        async for chunk in content.stream():
            data += chunk or b""
            if len(data) > limit:  # chunked bodies declare no length
                raise BodyTooLarge(limit)
    except MessageAborted:
        raise BadRequest(CLIENT_GONE) from None
    return bytes(data)


CLIENT_GONE = "the client disconnected while sending the body"
"""The 400 nobody receives: a body cut off (a client that left, or the connection guard
closing a slow upload, which logs its own summary line)."""


class JsonContentTypeError(APIError):
    status = 415
    type = "invalid_request_error"

    def __init__(self, sent: bytes | None):
        said = f"got {sent.decode('latin-1')!r}" if sent else "none was sent"
        super().__init__(f"send the body as JSON with Content-Type: application/json ({said})",
                         code="unsupported_media_type")


_JSON_TYPE = re.compile(rb"\s*application/(?:[\w.-]+\+)?json\s*(?:;.*)?", re.I | re.S)


def check_content_type(content_type: bytes | None, size: int) -> None:
    """415 unless a body (``size`` bytes) comes as ``application/json`` or ``*/*+json``,
    as the official SDKs, Claude Code, Codex and the web app send it. An empty body needs
    none (``POST /admin/cache/flush`` from curl)."""
    if size and (content_type is None or not _JSON_TYPE.fullmatch(content_type)):
        raise JsonContentTypeError(content_type)


def nesting_depth(raw: bytes) -> int:
    """The deepest ``[``/``{`` nesting of a JSON text, brackets inside strings not counted."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return 0  # cannot be too deep: skip the scan for most bodies
    skeleton = _STRING.sub(b"", raw).translate(None, _NOT_BRACKET)
    deepest, level = 0, 0
    for start in range(0, len(skeleton), _CHUNK):  # bounded memory for huge bodies
        part = np.frombuffer(skeleton, np.uint8, min(_CHUNK, len(skeleton) - start), start)
        # '[' 0x5B and '{' 0x7B have bit 1 set, ']' 0x5D and '}' 0x7D do not
        steps = ((part >> 1) & 1).astype(np.int32) * 2 - 1
        levels = np.cumsum(steps, dtype=np.int64) + level
        deepest, level = max(deepest, int(levels.max())), int(levels[-1])
    return deepest


def _no_constants(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 overflows to inf
        raise ValueError(f"{text} is out of range")
    return value


def parse_body(raw: bytes) -> dict[str, Any]:
    """``raw`` as a JSON object, or a 400 that says what is wrong with it."""
    if not raw.strip():
        raise BadRequest("request body is empty: send a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"request body is not valid UTF-8 (byte {exc.start})") from None
    if nesting_depth(raw) > MAX_DEPTH:
        raise BadRequest(f"invalid JSON body: nested deeper than {MAX_DEPTH} levels")
    try:
        body = json.loads(text, parse_constant=_no_constants, parse_float=_finite)
    except ValueError as exc:  # JSONDecodeError is a ValueError; so is a 5000-digit int
        raise BadRequest(f"invalid JSON body: {exc}") from None
    except RecursionError:  # only if the depth scan and the decoder ever disagree
        raise BadRequest(f"invalid JSON body: nested deeper than {MAX_DEPTH} levels") from None
    if not isinstance(body, dict):
        raise BadRequest(f"invalid JSON body: expected an object, got {_JSON_TYPES[type(body)]}")
    if _SURROGATE.search(raw):  # "\ud800" decodes to a lone surrogate no tokenizer encodes
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest("invalid JSON body: unpaired UTF-16 surrogate in a string") from None
    return body


async def read_body(request: Request) -> dict[str, Any]:
    """The request's JSON object; 413 past :func:`max_body_bytes`, 415 for a body that is
    not declared JSON, 400 for anything malformed."""
    raw = await _read_capped(request, max_body_bytes())
    check_content_type(request.get_first_header(b"content-type"), len(raw))
    return parse_body(raw)
