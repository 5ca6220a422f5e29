"""Live audio into transcription windows: blocks of samples arrive as they are recorded
(a microphone, a pipe), and each window is handed on as soon as it is full, so its text is
ready while the speaker goes on. A window ends at the quietest moment of its last fifth
(a pause between words, not the middle of one), and windows that hold only silence are
dropped: Whisper invents text for silence."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from . import SAMPLE_RATE

FRAME = SAMPLE_RATE // 50  # 20 ms: the unit a cut is looked for in
SILENCE_RMS = 1e-3  # about -60 dBFS: nothing worth transcribing


@dataclass
class Window:
    start: float  # seconds from the start of the recording
    audio: np.ndarray  # mono float32 at SAMPLE_RATE

    @property
    def end(self) -> float:
        return self.start + len(self.audio) / SAMPLE_RATE

    @property
    def silent(self) -> bool:
        return len(self.audio) == 0 or float(np.sqrt(np.mean(self.audio ** 2))) < SILENCE_RMS


def quiet_cut(audio: np.ndarray) -> int:
    """Where to end a full window: the start of the 20 ms frame with the least energy in
    its last fifth (the end itself when that is too short to look in)."""
    first = len(audio) * 4 // 5 // FRAME
    frames = len(audio) // FRAME
    if frames - first < 2:
        return len(audio)
    energy = [float(np.mean(audio[i * FRAME:(i + 1) * FRAME] ** 2)) for i in range(first, frames)]
    return (first + int(np.argmin(energy))) * FRAME or len(audio)


def windows(blocks: Iterable[np.ndarray], seconds: float) -> Iterator[Window]:
    """The windows of up to ``seconds`` that ``blocks`` (16 kHz mono, any sizes) make,
    each yielded as soon as enough audio has arrived; the rest when the blocks end."""
    size = max(FRAME * 2, int(seconds * SAMPLE_RATE))
    pending = np.zeros(0, np.float32)
    start = 0  # samples before ``pending``
    for block in blocks:
        pending = np.concatenate([pending, np.asarray(block, np.float32).reshape(-1)])
        while len(pending) >= size:
            cut = quiet_cut(pending[:size])
            yield Window(start / SAMPLE_RATE, pending[:cut])
            pending, start = pending[cut:], start + cut
    if len(pending):
        yield Window(start / SAMPLE_RATE, pending)
