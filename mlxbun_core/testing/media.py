"""Real media files for tests, made with the same libraries a user's tools use
(Pillow for images, PyAV/FFmpeg for audio and video, the WAV format by hand)."""

from __future__ import annotations

import base64
import io
import struct
import warnings

import numpy as np


def image_bytes(fmt: str = "PNG", size=(48, 32), color=None, seed: int = 0, mode: str = "RGB",
                **save) -> bytes:
    """An image file: a solid ``color`` or seeded noise."""
    from PIL import Image

    if color is not None:
        img = Image.new(mode, size, color)
    else:
        rng = np.random.default_rng(seed)
        pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
        img = Image.fromarray(pixels).convert(mode)
    buf = io.BytesIO()
    if fmt.upper() in ("HEIC", "HEIF"):
        import pillow_heif

        pillow_heif.register_heif_opener()
    img.save(buf, format=fmt, **save)
    return buf.getvalue()


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image_part(data: bytes, mime: str = "image/png") -> dict:
    """An OpenAI chat content part carrying the image inline."""
    return {"type": "image_url", "image_url": {"url": data_url(data, mime)}}


def pil_image(data: bytes):
    """The image file decoded as the reference libraries take it (RGB)."""
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


def tone(seconds: float = 1.0, rate: int = 16_000, freq: float = 440.0,
         channels: int = 1) -> np.ndarray:
    """A sine tone, [frames, channels] float32 in [-0.5, 0.5]."""
    t = np.arange(int(seconds * rate)) / rate
    x = 0.5 * np.sin(2 * np.pi * freq * t).astype(np.float32)
    return np.repeat(x[:, None], channels, axis=1)


def wav_bytes(samples: np.ndarray, rate: int = 16_000, bits: int = 16,
              float_fmt: bool = False) -> bytes:
    """A RIFF/WAVE file of ``samples`` ([frames, channels] floats in [-1, 1])."""
    x = np.asarray(samples, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    channels = x.shape[1]
    if float_fmt:
        body = x.astype("<f4" if bits == 32 else "<f8").tobytes()
        tag = 3
    elif bits == 8:
        body = np.clip(x * 128 + 128, 0, 255).astype(np.uint8).tobytes()
        tag = 1
    elif bits == 24:
        v = np.clip(x * (1 << 23), -(1 << 23), (1 << 23) - 1).astype(np.int32).reshape(-1)
        body = np.stack([v & 255, (v >> 8) & 255, (v >> 16) & 255],
                        axis=1).astype(np.uint8).tobytes()
        tag = 1
    else:
        scale = 1 << (bits - 1)
        dtype = {16: "<i2", 32: "<i4"}[bits]
        body = np.clip(x * scale, -scale, scale - 1).astype(dtype).tobytes()
        tag = 1
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * block, block, bits)
    chunks = (b"fmt " + struct.pack("<I", len(fmt)) + fmt
              + b"data" + struct.pack("<I", len(body)) + body)
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


def encoded_audio(samples: np.ndarray, rate: int = 16_000, container: str = "mp3",
                  codec: str = "mp3") -> bytes:
    """``samples`` ([frames, channels] floats) encoded with FFmpeg through PyAV."""
    import av

    x = np.asarray(samples, dtype=np.float32)
    if x.ndim == 1:
        x = x[:, None]
    layout = "mono" if x.shape[1] == 1 else "stereo"
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        fmt = stream.codec_context.format.name if stream.codec_context.format else "fltp"
        frame_size = stream.codec_context.frame_size or 1024
        resampler = av.AudioResampler(format=fmt, layout=layout, rate=rate)
        for start in range(0, len(x), frame_size):
            block = np.ascontiguousarray(x[start:start + frame_size].T)
            frame = av.AudioFrame.from_ndarray(block, format="fltp", layout=layout)
            frame.sample_rate = rate
            for f in resampler.resample(frame):
                for packet in stream.encode(f):
                    out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def video_bytes(seconds: float = 2.0, fps: int = 10, size=(64, 48), container: str = "mp4",
                codec: str = "mpeg4", seed: int = 0) -> bytes:
    """A short clip whose frames change colour over time (so sampling is visible)."""
    import av

    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        for i in range(int(seconds * fps)):
            img = ((base.astype(np.int32) + i * 20) % 256).astype(np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


# ---------------------------------------------------------------- reference runs

_vlm_cache: dict = {}


def vlm_load(path):
    """mlx-vlm's own ``load`` of a checkpoint (memoized per process)."""
    from mlx_vlm import load

    key = str(path)
    if key not in _vlm_cache:
        with warnings.catch_warnings():  # feature extractors warn about their own defaults
            warnings.simplefilter("ignore", UserWarning)
            _vlm_cache[key] = load(key)
    return _vlm_cache[key]


def vlm_prompt(path, messages, **template_kwargs) -> str:
    """The prompt text for ``messages`` (media parts as ``{"type": kind}``) rendered
    by the checkpoint's own chat template through the Hugging Face tokenizer."""
    _, processor = vlm_load(path)
    tok = getattr(processor, "tokenizer", processor)
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                   **template_kwargs)


def vlm_greedy(path, prompt: str, *, max_tokens: int, eos=(), **media) -> list:
    """Greedy token ids from mlx-vlm's own ``generate`` (cut at the first of ``eos``).

    ``media``: ``image=[PIL images]``, ``audio=[16 kHz arrays]``, ``video=[frames]``
    (+ ``video_metadata``), as mlx-vlm takes them.
    """
    from mlx_vlm import generate

    model, processor = vlm_load(path)
    out = generate(model, processor, prompt, max_tokens=max_tokens, temperature=0.0, **media)
    ids = list(out.token_ids or [])
    for i, t in enumerate(ids):
        if t in eos:
            return ids[: i + 1]
    return ids


PART_KINDS = {"image_url": "image", "video_url": "video", "input_audio": "audio",
              "audio_url": "audio"}


def vlm_reference(path, content: list, eos, n: int = 10, **media) -> list:
    """mlx-vlm's greedy tokens for one user turn of OpenAI chat ``content`` parts, thinking
    off: each media part becomes ``{"type": kind}`` for the template, ``media`` carries
    the decoded inputs (see :func:`vlm_greedy`)."""
    parts = [{"type": "text", "text": p["text"]} if p["type"] == "text"
             else {"type": PART_KINDS[p["type"]]} for p in content]
    prompt = vlm_prompt(path, [{"role": "user", "content": parts}], enable_thinking=False)
    return vlm_greedy(path, prompt, max_tokens=n, eos=eos, **media)
