"""Bytes to model-ready media: images, audio clips and video frames.

All decoding goes through maintained libraries: Pillow (plus ``pillow-heif`` for
HEIC/HEIF when installed) for images, a small WAV reader and SciPy's polyphase
resampler for WAV, and PyAV (FFmpeg) for every other audio and video container.
Undecodable input is a 400 ``prompt build failed: …``. These functions are CPU
work: call them off the event loop.
"""

from __future__ import annotations

import io
import math
import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import BadRequest

AUDIO_RATE = 16_000
AUDIO_MAX_S = 30.0
VIDEO_FPS = 2.0
VIDEO_MAX_FRAMES = 768
MAX_IMAGE_PIXELS = 64_000_000  # a 8000×8000 photo; beyond that it is a decompression bomb
VIDEO_FRAME_PIXELS = 640 * 640  # per frame, before the model's own resize
VIDEO_BUDGET_BYTES = 256 << 20  # all sampled RGB frames of one clip together


class MediaDecodeError(BadRequest):
    """Bytes that are not a decodable image, audio clip or video."""


def _fail(kind: str, why) -> MediaDecodeError:
    return MediaDecodeError(f"prompt build failed: {kind} could not be decoded: {why}")


# ---------------------------------------------------------------- images

_heif_ready: bool | None = None


def _register_heif() -> bool:
    global _heif_ready
    if _heif_ready is None:
        try:
            import pillow_heif

            pillow_heif.register_heif_opener()
            _heif_ready = True
        except ImportError:
            _heif_ready = False
    return _heif_ready


def decode_image(data: bytes):
    """PNG, JPEG, WebP, GIF (first frame), BMP, TIFF, AVIF, HEIC → an RGB PIL image,
    EXIF orientation applied, transparency laid on white."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    _register_heif()
    try:
        img: Image.Image = Image.open(io.BytesIO(data))
        w, h = img.size
        if w * h > MAX_IMAGE_PIXELS:
            raise MediaDecodeError(f"prompt build failed: image is {w}×{h}; the limit is "
                                   f"{MAX_IMAGE_PIXELS // 1_000_000} megapixels")
        img.seek(0)
        img.load()
        img = ImageOps.exif_transpose(img)
    except MediaDecodeError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError,
            Image.DecompressionBombError) as exc:
        raise _fail("image", _short(exc)) from None
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        img = Image.alpha_composite(canvas, rgba)
    return img.convert("RGB")


# ---------------------------------------------------------------- audio

def decode_audio(data: bytes) -> np.ndarray:
    """Any clip → float32 mono at 16 kHz, at most 30 s. WAV is read here; other
    containers (mp3, m4a/AAC, FLAC, Ogg/Opus, AIFF, …) go through PyAV."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        samples, rate = read_wav(data)
        mono = samples[: int(rate * AUDIO_MAX_S)].mean(axis=1, dtype=np.float32)
        out = resample(mono, rate, AUDIO_RATE)
    else:
        out = _decode_audio_av(data)
    out = out[: int(AUDIO_RATE * AUDIO_MAX_S)]
    if out.size == 0:
        raise _fail("audio", "the clip holds no samples")
    return np.ascontiguousarray(out, dtype=np.float32)


_WAV_FLOAT = 3
_WAV_PCM = 1
_WAV_EXTENSIBLE = 0xFFFE


def read_wav(data: bytes) -> tuple[np.ndarray, int]:
    """A RIFF/WAVE file → (float32 samples [frames, channels] in [-1, 1], rate).
    PCM 8/16/24/32-bit and IEEE float 32/64, any channel count and rate."""
    pos, fmt, body = 12, None, None
    while pos + 8 <= len(data):
        cid, size = data[pos:pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        chunk = data[pos + 8:pos + 8 + size]
        if cid == b"fmt " and size >= 16:
            tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", chunk)
            if tag == _WAV_EXTENSIBLE and size >= 26:
                tag = struct.unpack_from("<H", chunk, 24)[0]  # the sub-format GUID's first field
            fmt = (tag, channels, rate, bits)
        elif cid == b"data":
            body = chunk
        pos += 8 + size + (size & 1)
    if fmt is None or body is None:
        raise _fail("audio", "WAV file without fmt and data chunks")
    tag, channels, rate, bits = fmt
    if channels < 1 or rate < 1:
        raise _fail("audio", "WAV header has no channels or no sample rate")
    width = bits // 8
    body = body[: len(body) - len(body) % (width * channels or 1)]
    if tag == _WAV_FLOAT and bits in (32, 64):
        x = np.frombuffer(body, dtype="<f4" if bits == 32 else "<f8").astype(np.float32)
    elif tag == _WAV_PCM and bits == 8:
        x = (np.frombuffer(body, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif tag == _WAV_PCM and bits == 16:
        x = np.frombuffer(body, dtype="<i2").astype(np.float32) / 32768.0
    elif tag == _WAV_PCM and bits == 24:
        b = np.frombuffer(body, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        x = (np.where(v >= 1 << 23, v - (1 << 24), v)).astype(np.float32) / float(1 << 23)
    elif tag == _WAV_PCM and bits == 32:
        x = np.frombuffer(body, dtype="<i4").astype(np.float32) / float(1 << 31)
    else:
        raise _fail("audio", f"WAV format {tag} with {bits}-bit samples is not supported")
    return x.reshape(-1, channels), rate


def resample(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    """Band-limited polyphase resampling (SciPy)."""
    if src == dst or x.size == 0:
        return x.astype(np.float32, copy=False)
    from scipy.signal import resample_poly

    g = math.gcd(src, dst)
    return resample_poly(x, dst // g, src // g).astype(np.float32)


def _decode_audio_av(data: bytes) -> np.ndarray:
    av = _require_av("audio")
    chunks, have, cap = [], 0, int(AUDIO_RATE * AUDIO_MAX_S)
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise _fail("audio", "no audio stream")
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="flt", layout="mono", rate=AUDIO_RATE)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray().reshape(-1))
                    have += chunks[-1].size
                if have >= cap:
                    break
            else:
                for out in resampler.resample(None):
                    chunks.append(out.to_ndarray().reshape(-1))
    except MediaDecodeError:
        raise
    except Exception as exc:  # PyAV raises av.error.* (FFmpeg errors), ValueError, …
        raise _fail("audio", _short(exc)) from None
    return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)


# ---------------------------------------------------------------- video

@dataclass
class Video:
    """Frames sampled from a clip, with what the model's processor needs to know
    about where they came from (source rate and frame indices → timestamps)."""

    frames: np.ndarray  # [T, H, W, 3] uint8
    source_fps: float
    frames_indices: list = field(default_factory=list)
    total_num_frames: int = 0
    duration_s: float = 0.0


def decode_video(data: bytes, fps: float = VIDEO_FPS, max_frames: int = VIDEO_MAX_FRAMES) -> Video:
    """Any container FFmpeg reads → RGB frames sampled at ``fps`` (at most
    ``max_frames``), each scaled down to fit the per-clip memory budget."""
    av = _require_av("video")
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.video:
                raise _fail("video", "no video stream")
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            return _sample_frames(container, stream, fps, max_frames)
    except MediaDecodeError:
        raise
    except Exception as exc:
        raise _fail("video", _short(exc)) from None


def _sample_frames(container, stream, fps: float, max_frames: int) -> Video:
    rate = float(stream.average_rate or stream.guessed_rate or 25.0)
    duration = (float(stream.duration * stream.time_base) if stream.duration
                else (container.duration or 0) / 1e6)
    expected = min(max_frames, max(1, math.ceil(duration * fps))) if duration else max_frames
    pixels = min(VIDEO_FRAME_PIXELS, VIDEO_BUDGET_BYTES // (3 * expected))
    frames, indices, next_t, index = [], [], 0.0, -1
    for index, frame in enumerate(container.decode(stream)):
        t = float(frame.time) if frame.time is not None else index / rate
        if t + 1e-6 < next_t:
            continue
        w, h = _fit(frame.width, frame.height, pixels)
        frames.append(frame.to_ndarray(format="rgb24", width=w, height=h))
        indices.append(round(t * rate))
        next_t += 1.0 / fps
        if len(frames) >= max_frames:
            break
    if not frames:
        raise _fail("video", "the clip holds no frames")
    if len({f.shape for f in frames}) > 1:  # a mid-stream resolution change
        frames = [_resize(f, frames[0].shape[1], frames[0].shape[0]) for f in frames]
    total = max(stream.frames or 0, index + 1, indices[-1] + 1)
    return Video(np.stack(frames), rate, indices, total, duration or total / rate)


def _fit(w: int, h: int, pixels: int) -> tuple[int, int]:
    if w * h <= pixels:
        return w, h
    s = math.sqrt(pixels / (w * h))
    return max(2, int(w * s) // 2 * 2), max(2, int(h * s) // 2 * 2)


def _resize(frame: np.ndarray, w: int, h: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(frame).resize((w, h), Image.Resampling.BICUBIC))


# ---------------------------------------------------------------- helpers

def _require_av(kind: str):
    try:
        import av
    except ImportError:
        raise BadRequest(f"prompt build failed: decoding this {kind} needs PyAV "
                         "(pip install 'mlxbun[media]')") from None
    return av


def _short(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "…"
