"""A :class:`Transcription` in OpenAI's ``response_format`` shapes: ``json``, ``text``,
``srt``, ``vtt`` and ``verbose_json`` (with ``segments`` and/or ``words``)."""

from __future__ import annotations

import math
from typing import Any

from . import Segment, Transcription

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
TEXT_TYPES = {"text": "text/plain", "srt": "application/x-subrip", "vtt": "text/vtt"}


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None  # JSON has no NaN


def _clock(seconds: float, sep: str) -> str:
    ms = round(max(seconds, 0.0) * 1000)
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def _cues(t: Transcription) -> list[Segment]:
    """Segments to caption; a model that gave none gets one cue over the whole audio."""
    return t.segments or [Segment(0, 0.0, t.duration, t.text)]


def srt(t: Transcription) -> str:
    return "".join(f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text.strip()}\n\n"
                   for i, s in enumerate(_cues(t), 1))


def vtt(t: Transcription) -> str:
    return "WEBVTT\n\n" + "".join(f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n"
                                  f"{s.text.strip()}\n\n" for s in _cues(t))


def _segment(s: Segment, seek: int) -> dict[str, Any]:
    return {"id": s.id, "seek": seek, "start": s.start, "end": s.end, "text": s.text,
            "tokens": s.tokens, "temperature": s.temperature,
            "avg_logprob": _finite(s.avg_logprob),
            "compression_ratio": _finite(s.compression_ratio),
            "no_speech_prob": _finite(s.no_speech_prob)}


def verbose(t: Transcription, granularities: set[str]) -> dict[str, Any]:
    """OpenAI's verbose_json: segments unless only words were asked for, words when asked."""
    out: dict[str, Any] = {"task": "transcribe", "language": t.language,
                           "duration": t.duration, "text": t.text}
    if "segment" in granularities or not granularities:
        out["segments"] = [_segment(s, round(s.start * 100)) for s in t.segments]
    if "word" in granularities:
        out["words"] = [{"word": w.word.strip(), "start": w.start, "end": w.end}
                        for s in t.segments for w in s.words]
    return out


def render(t: Transcription, fmt: str, granularities: set[str]) -> tuple[str | dict[str, Any], str]:
    """The answer for ``fmt``: a JSON object (``json``, ``verbose_json``) or text, and its
    content type."""
    if fmt == "json":
        return {"text": t.text}, "application/json"
    if fmt == "verbose_json":
        return verbose(t, granularities), "application/json"
    body = {"text": t.text, "srt": srt(t), "vtt": vtt(t)}[fmt]
    return body, TEXT_TYPES[fmt]
