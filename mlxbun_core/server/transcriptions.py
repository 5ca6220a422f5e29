"""POST /v1/audio/transcriptions: OpenAI's speech-to-text surface.

A multipart form: ``file`` (the audio), ``model``, ``language``, ``prompt``,
``temperature``, ``response_format`` (``json``, ``text``, ``srt``, ``vtt``,
``verbose_json``) and ``timestamp_granularities[]`` (``segment``, ``word``). The core
decodes the audio (:mod:`mlxbun_core.speech.audio`); the served model's family answers
through the ``transcribe`` hook. Every bad input is a 400 in OpenAI's error shape.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from blacksheep import Request, Response
from blacksheep.contents import Content
from blacksheep.multipart import parse_multipart

from ..errors import BadRequest
from ..speech import TranscribeOptions
from ..speech.audio import decode_audio
from ..speech.formats import FORMATS, render
from .body import _read_capped, max_body_bytes
from .common import guarded, json_response

if TYPE_CHECKING:
    from ..engine.core import Engine
    from .state import App

ROUTE = "/v1/audio/transcriptions"
GRANULARITIES = ("segment", "word")
log = logging.getLogger("mlxbun.server")


class Form:
    """The parts of a multipart body: text fields (repeatable) and the file."""

    def __init__(self, raw: bytes, content_type: bytes | None):
        if not content_type or not content_type.lower().startswith(b"multipart/form-data"):
            raise BadRequest("send multipart/form-data with the audio in a 'file' part "
                             "(as OpenAI's clients do)", param="file")
        self.fields: dict[str, list[str]] = {}
        self.file: bytes | None = None
        self.file_name = "file"
        try:
            parts = list(parse_multipart(raw))
        except Exception as exc:  # the parser's errors are not typed
            raise BadRequest(f"malformed multipart body: {exc}") from None
        for part in parts:
            name = part.name.decode("utf-8", "replace")
            if name == "file":
                self.file = bytes(part.data)
                self.file_name = (part.file_name or b"file").decode("utf-8", "replace")
            else:
                self.fields.setdefault(name, []).append(part.data.decode("utf-8", "replace"))

    def text(self, name: str) -> str | None:
        values = self.fields.get(name)
        return values[-1] if values else None


def parse_options(form: Form) -> tuple[TranscribeOptions, str, set[str]]:
    fmt = form.text("response_format") or "json"
    if fmt not in FORMATS:
        raise BadRequest(f"response_format must be one of {', '.join(FORMATS)}",
                         param="response_format")
    granularities = set(form.fields.get("timestamp_granularities[]", []) +
                        form.fields.get("timestamp_granularities", []))
    if granularities - set(GRANULARITIES):
        raise BadRequest("timestamp_granularities[] takes 'segment' and 'word'",
                         param="timestamp_granularities")
    if granularities and fmt != "verbose_json":
        raise BadRequest("timestamp_granularities needs response_format verbose_json",
                         param="timestamp_granularities")
    temperature: float | None = None
    raw_t = form.text("temperature")
    if raw_t is not None:
        try:
            temperature = float(raw_t)
        except ValueError:
            temperature = -1.0
        if not (math.isfinite(temperature) and 0 <= temperature <= 1):
            raise BadRequest("temperature must be a number from 0 to 1", param="temperature")
    options = TranscribeOptions(language=form.text("language") or None,
                                prompt=form.text("prompt") or None, temperature=temperature,
                                words="word" in granularities)
    return options, fmt, granularities


def register(app: App, engine: Engine) -> None:
    @guarded()
    async def transcriptions(request: Request) -> Response:
        raw = await _read_capped(request, max_body_bytes())
        form = Form(raw, request.content_type())
        options, fmt, granularities = parse_options(form)
        if form.file is None:
            raise BadRequest("no audio: send the recording in a multipart 'file' part",
                             param="file")
        audio = decode_audio(form.file, form.file_name)
        result = await engine.transcribe(audio, options)
        body, content_type = render(result, fmt, granularities)
        if isinstance(body, dict):
            return json_response(body)
        return Response(200, None, Content(content_type.encode() + b"; charset=utf-8",
                                           body.encode()))

    app.router.add_post(ROUTE, transcriptions)
