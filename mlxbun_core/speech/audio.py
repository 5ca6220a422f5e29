"""Audio files to 16 kHz mono float32: WAV with the stdlib and numpy, other formats
(MP3, FLAC, OGG/Vorbis) with miniaudio when it is installed, anything else through an
``ffmpeg`` on PATH. Undecodable input is a 400, never a crash."""

from __future__ import annotations

import io
import shutil
import subprocess
import wave
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

from ..errors import BadRequest
from . import SAMPLE_RATE

FFMPEG_TIMEOUT_S = 120


def _resample(x: np.ndarray, rate: int) -> np.ndarray:
    if rate == SAMPLE_RATE:
        return x
    from scipy.signal import resample_poly

    g = np.gcd(rate, SAMPLE_RATE)
    return resample_poly(x, SAMPLE_RATE // g, rate // g).astype(np.float32)


def decode_wav(data: bytes) -> np.ndarray:
    """PCM WAV (8/16/24/32-bit integer) to 16 kHz mono; ``wave.Error`` when it is not one."""
    with wave.open(io.BytesIO(data)) as w:
        channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
        raw = w.readframes(w.getnframes())
    return _resample(pcm_mono(raw, width, channels), rate)


def pcm_mono(raw: bytes, width: int, channels: int) -> np.ndarray:
    """Interleaved integer PCM frames (``width`` bytes a sample) to mono float32 in [-1, 1]."""
    if width == 3:  # 24-bit: widen to 32 by hand (numpy has no int24)
        b = np.frombuffer(raw[: len(raw) // 3 * 3], np.uint8).reshape(-1, 3)
        ints = (b[:, 0].astype(np.int32) << 8 | b[:, 1].astype(np.int32) << 16
                | b[:, 2].astype(np.int32) << 24)
        x = ints.astype(np.float32) / 2**31
    elif width == 1:
        x = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128) / 128
    else:
        dtype = {2: "<i2", 4: "<i4"}[width]
        x = np.frombuffer(raw, dtype).astype(np.float32) / 2 ** (8 * width - 1)
    return x[: len(x) // channels * channels].reshape(-1, channels).mean(axis=1)


def wav_blocks(stream: BinaryIO, seconds: float = 0.5) -> Iterator[np.ndarray]:
    """A WAV arriving on a pipe (stdin, a recorder's output) as 16 kHz mono blocks of
    ``seconds``, each yielded as soon as it has arrived; ``wave.Error`` for no WAV."""
    with wave.open(stream) as w:
        channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
        while raw := w.readframes(max(1, int(rate * seconds))):
            yield _resample(pcm_mono(raw, width, channels), rate)


def _miniaudio(data: bytes) -> np.ndarray | None:
    try:
        import miniaudio
    except ImportError:
        return None
    try:
        got = miniaudio.decode(data, output_format=miniaudio.SampleFormat.FLOAT32,
                               nchannels=1, sample_rate=SAMPLE_RATE)
    except miniaudio.DecodeError:
        return None
    return np.asarray(got.samples, dtype=np.float32)


def _ffmpeg(data: bytes) -> np.ndarray | None:
    exe = shutil.which("ffmpeg")
    if exe is None:
        return None
    proc = subprocess.run([exe, "-nostdin", "-loglevel", "error", "-i", "pipe:0", "-f", "f32le",
                           "-ac", "1", "-ar", str(SAMPLE_RATE), "pipe:1"],
                          input=data, capture_output=True, timeout=FFMPEG_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        return None
    return np.frombuffer(proc.stdout, np.float32).copy()


def decode_audio(data: bytes, name: str = "file") -> np.ndarray:
    """``data`` (a whole audio file) as 16 kHz mono float32; 400 when nothing decodes it."""
    if not data:
        raise BadRequest(f"{name} is empty", param="file")
    try:
        samples: np.ndarray | None = decode_wav(data)
    except (wave.Error, EOFError, KeyError, ValueError):
        samples = _miniaudio(data)
        if samples is None:
            samples = _ffmpeg(data)
    if samples is None:
        how = "WAV, MP3, FLAC or OGG" + ("" if shutil.which("ffmpeg") else
                                         " (install ffmpeg for other formats)")
        raise BadRequest(f"could not decode {name} as audio: send {how}", param="file")
    if samples.size == 0:
        raise BadRequest(f"{name} holds no audio samples", param="file")
    return samples
