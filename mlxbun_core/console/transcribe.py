"""``mlxbun transcribe FILE``: one audio file to text with a local speech model, no
server. The same decoding, hook and formats as ``POST /v1/audio/transcriptions``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..speech import TranscribeOptions
from ..speech.formats import FORMATS, render


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("transcribe", help="speech to text from an audio file, no server")
    p.add_argument("file", help="the recording: WAV, MP3, FLAC or OGG (others with ffmpeg)")
    p.add_argument("--model", required=True,
                   help="a speech checkpoint (a path or a local model's name), e.g. Whisper")
    p.add_argument("--format", choices=FORMATS, default="text",
                   help="output: text (default), json, verbose_json, srt or vtt")
    p.add_argument("--language", help="the spoken language's code (default: detected)")
    p.add_argument("--prompt", help="text to condition on (names, vocabulary, style)")
    p.add_argument("--temperature", type=float,
                   help="one sampling temperature (default: the model's fallback schedule)")
    p.add_argument("--word-timestamps", action="store_true",
                   help="words with their times in verbose_json")
    p.set_defaults(handler=cmd_transcribe)


def cmd_transcribe(args: argparse.Namespace) -> int:
    from ..errors import APIError
    from ..loader import load
    from ..model import LoadOptions
    from ..speech.audio import decode_audio

    path = Path(args.file)
    try:
        audio = decode_audio(path.read_bytes(), path.name)
        model = load(args.model, LoadOptions(), progress=False)
        if model.kind != "speech":
            raise APIError(f"{model.id} is a {model.kind} model, not a speech model")
        options = TranscribeOptions(language=args.language, prompt=args.prompt,
                                    temperature=args.temperature, words=args.word_timestamps)
        result = model.hooks.transcribe(model=model, audio=audio, options=options)
        if result is None:
            raise APIError(f"{model.id}: no plugin transcribes this model")
    except (OSError, APIError) as exc:
        print(f"mlxbun transcribe: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 1
    granularities = {"segment", "word"} if args.word_timestamps else set()
    body, _ = render(result, args.format, granularities)
    text = json.dumps(body, ensure_ascii=False, indent=2) if isinstance(body, dict) else body
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0
