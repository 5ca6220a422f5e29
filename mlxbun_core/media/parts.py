"""Media content parts of a chat request: read, checked, loaded.

A chat message's ``content`` may mix text with media parts in the OpenAI shapes
(plus the aliases mlxbun accepts). Here each media part becomes a
:class:`MediaRef` and, in the message the chat template sees, a placeholder
``{"type": "image"}`` / ``{"type": "audio"}`` / ``{"type": "video"}`` at the same
position, so templates place the media markers in document order.
:func:`load` then fetches and decodes every reference, off the event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from typing import Any

from ..errors import BadRequest
from . import decode, fetch

KINDS = ("image", "audio", "video")
PART_KINDS = {"image_url": "image", "image": "image", "input_image": "image",
              "input_audio": "audio", "audio": "audio", "audio_url": "audio",
              "video_url": "video", "video": "video"}


@dataclass(frozen=True)
class MediaRef:
    """One media part as the request named it: an http(s) or ``data:`` URL."""

    kind: str
    url: str
    format: str | None = None  # a client's hint (input_audio.format); content decides


@dataclass
class MediaItem:
    """A fetched and decoded media part, ready for a model's processor."""

    kind: str
    value: Any  # PIL image (image), float32 16 kHz mono array (audio), decode.Video (video)
    digest: str  # sha256 of the kind and the raw bytes
    nbytes: int


def _bad(msg: str, param: str = "messages") -> BadRequest:
    return BadRequest(msg, param=param)


def _url_field(value, where: str, param: str) -> str:
    """``{"url": "..."}`` or a bare string."""
    if isinstance(value, dict):
        value = value.get("url")
    if not isinstance(value, str) or not value.strip():
        raise _bad(f"{where} needs a url string (data: or http(s)://)", param)
    return value.strip()


def _inline(data, where: str, param: str) -> str:
    if not isinstance(data, str) or not data.strip():
        raise _bad(f"{where} needs base64 data", param)
    return "data:;base64," + data


def media_ref(part: dict, param: str = "messages") -> MediaRef:
    """A media content part → its reference; a malformed part is a 400 naming ``param``."""
    kind = part["type"]
    media = PART_KINDS[kind]
    if kind in ("image_url", "input_image", "audio_url", "video_url"):
        return MediaRef(media, _url_field(part.get("image_url" if media == "image" else kind),
                                          f"{kind} part", param))
    if kind == "input_audio":
        spec = part.get("input_audio")
        if not isinstance(spec, dict):
            raise _bad("input_audio part needs an input_audio object with base64 data", param)
        fmt = spec.get("format")
        return MediaRef(media, _inline(spec.get("data"), "input_audio part", param),
                        fmt if isinstance(fmt, str) else None)
    # the "image" / "audio" / "video" aliases: base64 under "data", or a URL
    if part.get("data") is not None:
        return MediaRef(media, _inline(part["data"], f"{kind} part", param))
    for key in (kind, f"{kind}_url", "url"):
        if part.get(key) is not None:
            return MediaRef(media, _url_field(part[key], f"{kind} part", param))
    raise _bad(f"{kind} part needs base64 data or a url", param)


def split_content(parts: list, param: str = "messages") -> tuple[Any, list[MediaRef]]:
    """A content-part list → (template content, media refs in document order).

    Text-only content stays a plain string (what every template reads); with
    media it is a part list with ``{"type": kind}`` placeholders. Errors name the
    client's field ``param`` (the message list: ``messages``, or Responses' ``input``).
    """
    texts, out, refs = [], [], []
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise _bad("text content parts need a string 'text'", param)
            texts.append(part["text"])
            out.append({"type": "text", "text": part["text"]})
        elif isinstance(kind, str) and kind in PART_KINDS:  # a list type is unhashable
            ref = media_ref(part, param)
            refs.append(ref)
            out.append({"type": ref.kind})
        else:
            raise _bad(f"unsupported content part type: {kind!r}", param)
    return (out if refs else "".join(texts)), refs


def check_combination(kinds) -> None:
    """The spec's combination rules for one request."""
    if "video" in kinds and "audio" in kinds:
        raise _bad("video and audio content parts cannot be combined")


def unsupported(model_id: str, kind: str) -> BadRequest:
    """The 400 for media a model cannot take (never a silent text-only answer)."""
    if kind == "image":
        return _bad(f"model has no vision sidecar: {model_id} does not accept images")
    return _bad(f"model {model_id} does not accept {kind} input")


# ---------------------------------------------------------------- loading

_DECODERS = {"image": decode.decode_image, "audio": decode.decode_audio,
             "video": decode.decode_video}


async def load(refs: list[MediaRef], policy: fetch.FetchPolicy | None = None) -> list[MediaItem]:
    """Fetch every reference (concurrently) and decode each in a worker thread."""
    async def one(ref: MediaRef) -> MediaItem:
        data, _mime = await fetch.fetch(ref.url, ref.kind, policy)
        value = await asyncio.to_thread(_DECODERS[ref.kind], data)
        digest = hashlib.sha256(ref.kind.encode() + b"\0" + data).hexdigest()
        return MediaItem(ref.kind, value, digest, len(data))

    return list(await asyncio.gather(*(one(r) for r in refs)))


def digest(items: list[MediaItem]) -> str:
    """One hash over a request's media, in order (a prompt-cache namespace)."""
    h = hashlib.sha256()
    for item in items:
        h.update(item.digest.encode())
    return h.hexdigest()
