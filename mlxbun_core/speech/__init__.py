"""Speech in: the records a ``transcribe`` hook returns, audio decoding, the OpenAI
transcription formats and the ``mlxbun transcribe`` verb. The models themselves live in
family plugins (``plugins/speech``: Whisper through mlx-audio)."""

from __future__ import annotations

from dataclasses import dataclass, field

SAMPLE_RATE = 16_000
"""What every ``transcribe`` hook is given: mono float32 samples at 16 kHz."""


@dataclass
class TranscribeOptions:
    """What a request asks of the model (OpenAI's transcription fields)."""

    language: str | None = None  # ISO-639-1 code; None: the model detects it
    prompt: str | None = None  # text the model continues from (vocabulary, style)
    temperature: float | None = None  # None: the model's own fallback schedule
    words: bool = False  # word timestamps wanted (``timestamp_granularities`` has "word")


@dataclass
class Word:
    word: str
    start: float
    end: float


@dataclass
class Segment:
    id: int
    start: float
    end: float
    text: str
    tokens: list[int] = field(default_factory=list)
    temperature: float = 0.0
    avg_logprob: float = 0.0
    compression_ratio: float = 0.0
    no_speech_prob: float = 0.0
    words: list[Word] = field(default_factory=list)


@dataclass
class Transcription:
    """A ``transcribe`` hook's answer: the text, the language spoken, the audio's length
    in seconds and, where the model times its output, segments (with words when asked)."""

    text: str
    language: str
    duration: float
    segments: list[Segment] = field(default_factory=list)
