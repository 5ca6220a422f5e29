"""``mlxbun dictate``: speak, and the transcript prints while you talk.

Audio is cut into windows as it arrives (:mod:`mlxbun_core.speech.live`) and each window
is transcribed as soon as it is full, its segments printed then; the last one after the
recording ends. The microphone is read through ``sounddevice`` (PortAudio) when it is
installed and a capture device exists; otherwise the verb says so and exits 2.
``--from FILE`` (``-``: a WAV on stdin, read as it arrives) runs the same path on a
recording, which is how it is tested.
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ..speech import SAMPLE_RATE, TranscribeOptions

if TYPE_CHECKING:  # numpy and the windowing load when the verb runs, not for every verb
    import numpy as np

    from ..speech.live import Window

NO_MIC = 2  # exit status: no way to record here


class NoMicrophone(Exception):
    """Capture is impossible here; the message says why and what to do instead."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("dictate", help="speech to text from the microphone, printed "
                              "as you speak (Enter or Ctrl-C stops)")
    p.add_argument("--model", required=True,
                   help="a speech checkpoint (a path or a local model's name), e.g. Whisper")
    p.add_argument("--from", dest="source", metavar="FILE",
                   help="transcribe a recording as if it were live ('-': a WAV on stdin)")
    p.add_argument("--window", type=float, default=30.0,
                   help="seconds of audio per transcription window (default 30, Whisper's)")
    p.add_argument("--language", help="the spoken language's code (default: detected)")
    p.add_argument("--prompt", help="text to condition on (names, vocabulary, style)")
    p.add_argument("--temperature", type=float,
                   help="one sampling temperature (default: the model's fallback schedule)")
    p.add_argument("--timestamps", action="store_true",
                   help="prefix each line with its time range in the recording")
    p.add_argument("--verbose", action="store_true",
                   help="one line per window on stderr: its time range, segments and time taken")
    p.set_defaults(handler=cmd_dictate)


def _fail(message: str, status: int = 1) -> int:
    print(f"mlxbun dictate: {message}", file=sys.stderr)
    return status


def cmd_dictate(args: argparse.Namespace) -> int:
    from ..errors import APIError
    from ..loader import load
    from ..model import LoadOptions
    from ..speech.live import windows

    if args.window <= 0:
        return _fail("--window must be a positive number of seconds")
    try:
        blocks = _source(args.source)
        model = load(args.model, LoadOptions(), progress=False)
        if model.kind != "speech":
            raise APIError(f"{model.id} is a {model.kind} model, not a speech model")
        options = TranscribeOptions(language=args.language, prompt=args.prompt,
                                    temperature=args.temperature)
        for window in windows(blocks, args.window):
            _transcribe(model, window, options, args)
    except NoMicrophone as exc:
        return _fail(str(exc), NO_MIC)
    except (wave.Error, EOFError) as exc:
        return _fail(f"the input is not a PCM WAV stream ({exc or 'it ended in the header'})")
    except (OSError, APIError) as exc:
        return _fail(getattr(exc, "message", None) or str(exc))
    except KeyboardInterrupt:
        return 130
    return 0


def _transcribe(model, window: Window, options: TranscribeOptions,
                args: argparse.Namespace) -> None:
    """Transcribe one window and print its segments (times from the recording's start)."""
    from ..errors import APIError

    if window.silent:
        if args.verbose:
            print(f"mlxbun dictate: {window.start:.2f}-{window.end:.2f} s · silence",
                  file=sys.stderr, flush=True)
        return
    started = time.monotonic()
    result = model.hooks.transcribe(model=model, audio=window.audio, options=options)
    if result is None:
        raise APIError(f"{model.id}: no plugin transcribes this model")
    lines = [(window.start + s.start, window.start + s.end, s.text.strip())
             for s in result.segments] or [(window.start, window.end, result.text.strip())]
    for start, end, text in lines:
        if text:
            stamp = f"[{_clock(start)} -> {_clock(end)}] " if args.timestamps else ""
            print(stamp + text, flush=True)
    if args.verbose:
        print(f"mlxbun dictate: {window.start:.2f}-{window.end:.2f} s · {len(lines)} "
              f"segments · {1e3 * (time.monotonic() - started):.0f} ms",
              file=sys.stderr, flush=True)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(seconds, 60)
    return f"{int(minutes):02d}:{secs:05.2f}"


def _source(name: str | None) -> Iterator[np.ndarray]:
    """The audio blocks: a file's, stdin's WAV as it arrives, or the microphone's."""
    from ..speech.audio import decode_audio, wav_blocks

    if name is None:
        return _microphone()
    if name == "-":
        return wav_blocks(sys.stdin.buffer)
    path = Path(name)
    audio = decode_audio(path.read_bytes(), path.name)
    half = SAMPLE_RATE // 2  # handed on as a recorder would: half a second at a time
    return (audio[i:i + half] for i in range(0, len(audio), half))


def _microphone() -> Iterator[np.ndarray]:
    """The default input device, 16 kHz mono, until Enter (or end of stdin) or Ctrl-C."""
    try:
        import sounddevice  # type: ignore[import-untyped]  # no stubs
    except (ImportError, OSError) as exc:  # OSError: the module is there, PortAudio is not
        raise NoMicrophone(
            f"recording needs the sounddevice package and PortAudio ({exc}); install them "
            "(pip install sounddevice) or transcribe a recording with --from FILE") from None
    try:
        sounddevice.query_devices(kind="input")
    except Exception as exc:  # PortAudioError, ValueError: no default input device
        raise NoMicrophone(f"no microphone found ({exc}); plug one in or use --from FILE"
                           ) from None
    return _record(sounddevice)


def _record(sounddevice) -> Iterator[np.ndarray]:
    blocks: queue.Queue[np.ndarray | None] = queue.Queue()

    def until_enter() -> None:
        sys.stdin.readline()
        blocks.put(None)

    threading.Thread(target=until_enter, daemon=True).start()
    print("mlxbun dictate: listening; press Enter to stop", file=sys.stderr, flush=True)
    with sounddevice.InputStream(samplerate=SAMPLE_RATE, channels=1, dtype="float32",
                                 callback=lambda data, *_: blocks.put(data[:, 0].copy())):
        while (block := blocks.get()) is not None:
            yield block
