"""Whisper for mlxbun: claims Whisper checkpoints in mlx-audio's layout
(``mlx-community/whisper-*``) and transcribes through mlx-audio's own decoder, so its
text, timestamps and fallback rules are mlx-audio's (and, through it, OpenAI Whisper's).

mlx-audio rather than mlx-whisper or parakeet-mlx: it is already in every mlxbun install
(mlx-vlm depends on it), needs neither torch nor numba nor ffmpeg, and one loader serves
Whisper and, later, its other speech families (Parakeet among them).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from mlxbun_core.errors import BadRequest
from mlxbun_core.hookspecs import hookimpl
from mlxbun_core.model import LoadedModel, LoadOptions
from mlxbun_core.speech import SAMPLE_RATE, Segment, TranscribeOptions, Transcription, Word

FAMILY = "whisper"
log = logging.getLogger("mlxbun.whisper")


@hookimpl
def claims(config: dict[str, Any]) -> str | None:
    return FAMILY if config.get("model_type") == "whisper" else None


@hookimpl
def load_model(path: Path, config: dict[str, Any], options: LoadOptions) -> LoadedModel:
    from mlx_audio.stt import load

    model = load(str(path))
    try:  # mlx-audio only warns when the processor failed to load; nothing decodes then
        tokenizer = model.get_tokenizer().hf_tokenizer
    except ValueError:
        raise ValueError(f"{path}: no Whisper tokenizer and feature extractor (the "
                         "checkpoint lacks tokenizer files or preprocessor_config.json)"
                         ) from None
    return LoadedModel(id=options.model_id or path.name, path=path, config=config, model=model,
                       tokenizer=tokenizer, kind="speech",
                       context_window=int(config.get("n_text_ctx") or 448))


def _language(model: Any, wanted: str | None) -> str | None:
    """The code mlx-audio takes; a 400 for one this checkpoint cannot write."""
    from mlx_audio.stt.models.whisper.tokenizer import LANGUAGES, TO_LANGUAGE_CODE

    if wanted is None:
        return None
    code = wanted.strip().lower()
    code = TO_LANGUAGE_CODE.get(code, code)
    if code not in LANGUAGES:
        raise BadRequest(f"unknown language {wanted!r}: use an ISO-639-1 code such as 'en'",
                         param="language")
    if not model.is_multilingual and code != "en":
        raise BadRequest(f"this Whisper checkpoint is English-only: language {wanted!r} is "
                         "not available", param="language")
    return str(code)


def _segment(raw: dict[str, Any]) -> Segment:
    words = [Word(str(w["word"]), float(w["start"]), float(w["end"]))
             for w in raw.get("words") or ()]
    return Segment(id=int(raw["id"]), start=float(raw["start"]), end=float(raw["end"]),
                   text=str(raw["text"]), tokens=[int(t) for t in raw.get("tokens", ())],
                   temperature=float(raw.get("temperature") or 0.0),
                   avg_logprob=float(raw.get("avg_logprob", 0.0)),
                   compression_ratio=float(raw.get("compression_ratio", 0.0)),
                   no_speech_prob=float(raw.get("no_speech_prob", 0.0)), words=words)


def decode_kwargs(options: TranscribeOptions) -> dict[str, Any]:
    """mlx-audio's ``generate`` arguments for ``options`` (the parity tests use them too)."""
    kw: dict[str, Any] = {"initial_prompt": options.prompt or None,
                          "word_timestamps": options.words}
    if options.temperature is not None:  # else mlx-audio's (0, 0.2, ..., 1.0) fallback
        kw["temperature"] = options.temperature
    return kw


@hookimpl
def transcribe(model: LoadedModel, audio: np.ndarray,
               options: TranscribeOptions) -> Transcription:
    started = time.monotonic()
    whisper = model.model
    language = _language(whisper, options.language)
    out = whisper.generate(audio, language=language, **decode_kwargs(options))
    duration = len(audio) / SAMPLE_RATE
    log.info("transcribe · %.1f s of audio · %s · %d segments · %.0f ms", duration,
             out.language, len(out.segments or ()), 1e3 * (time.monotonic() - started))
    from mlx_audio.stt.models.whisper.tokenizer import LANGUAGES

    spoken = LANGUAGES.get(str(out.language), str(out.language))  # OpenAI says "english"
    return Transcription(text=str(out.text).strip(), language=spoken,
                         duration=duration, segments=[_segment(s) for s in out.segments or ()])
