"""The fields of client frames that carry the user's words and pictures, checked: a bad one
is a :class:`~mlxbun_core.errors.BadRequest`, which the agent answers with an error frame."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from ..errors import BadRequest

MAX_IMAGES = 8
MAX_IMAGE_CHARS = 12 << 20  # base64 characters across one prompt's images
MAX_TEXT_CHARS = 1 << 20
IMAGE_MIME = re.compile(r"image/[A-Za-z0-9.+-]+")


def text_arg(frame: dict, key: str = "text") -> str:
    """``frame[key]`` as a string of at most :data:`MAX_TEXT_CHARS` characters."""
    text = frame.get(key)
    if not isinstance(text, str):
        raise BadRequest(f"{key} must be a string")
    if len(text) > MAX_TEXT_CHARS:
        raise BadRequest(f"{key} is longer than {MAX_TEXT_CHARS} characters")
    return text


def image_parts(images: Any) -> list:
    """``[{data, mimeType}]`` (base64) as OpenAI ``image_url`` data-URL parts."""
    if images is None:
        return []
    if not isinstance(images, list) or len(images) > MAX_IMAGES:
        raise BadRequest(
            f"images must be a list of at most {MAX_IMAGES} {{data, mimeType}} objects")
    parts, total = [], 0
    for img in images:
        data = img.get("data") if isinstance(img, dict) else None
        mime = img.get("mimeType") if isinstance(img, dict) else None
        if not isinstance(data, str) or not isinstance(mime, str) or not IMAGE_MIME.fullmatch(mime):
            raise BadRequest("each image needs base64 'data' and an image/* 'mimeType'")
        total += len(data)
        if total > MAX_IMAGE_CHARS:
            raise BadRequest(f"images are larger than {MAX_IMAGE_CHARS >> 20} MiB of base64")
        try:
            base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise BadRequest("image data is not valid base64") from exc
        parts.append({"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}})
    return parts
