"""A tiny random-weight Whisper checkpoint and synthetic speech-like audio, for the
speech tests.

The checkpoint is in mlx-audio's layout (``config.json`` with ``model_type: whisper``,
MLX weight names) with a Hugging Face ``WhisperProcessor`` beside it: a byte-level BPE
vocabulary trained on a small English corpus, then Whisper's special tokens in
Whisper's order (``<|endoftext|>`` first, the timestamps ``<|0.00|>`` … ``<|30.00|>``
last), so decoding, timestamp rules and word splitting run as they do on a published
English-only checkpoint. Random weights: the text is gibberish, the same every run.
"""

from __future__ import annotations

import atexit
import io
import json
import shutil
import tempfile
import threading
import wave
from pathlib import Path

import numpy as np

from .tokenizer import _ENGLISH

SPECIALS = ("<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|translate|>",
            "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>",
            "<|notimestamps|>", *(f"<|{i * 0.02:.2f}|>" for i in range(1501)))
TEXT_VOCAB = 400  # byte-level BPE pieces before the specials

_lock = threading.Lock()
_cache: dict[int, Path] = {}
_root: Path | None = None


def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TEXT_VOCAB, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_ENGLISH.splitlines(), trainer)
    tok.add_special_tokens(list(SPECIALS))
    return str(tok.to_str())


def write_whisper_checkpoint(path: Path, seed: int = 0, text_ctx: int = 64) -> Path:
    """Write the checkpoint into ``path`` (created) and return it."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_audio.stt.models.whisper.whisper import Model, ModelDimensions

    path.mkdir(parents=True, exist_ok=True)
    tok_json = _tokenizer_json()
    n_vocab = len(json.loads(tok_json)["model"]["vocab"]) + len(SPECIALS)
    config = {"model_type": "whisper", "n_mels": 80, "n_audio_ctx": 1500,
              "n_audio_state": 32, "n_audio_head": 2, "n_audio_layer": 1,
              "n_vocab": n_vocab, "n_text_ctx": text_ctx, "n_text_state": 32,
              "n_text_head": 2, "n_text_layer": 2}
    mx.random.seed(seed)
    model = Model(ModelDimensions.from_dict(config), dtype=mx.float32)
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "tokenizer.json").write_text(tok_json)
    eot = SPECIALS[0]
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "WhisperTokenizer", "bos_token": eot, "eos_token": eot,
        "unk_token": eot, "pad_token": eot, "model_max_length": 1024}))
    (path / "preprocessor_config.json").write_text(json.dumps({
        "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 80,
        "sampling_rate": 16000, "hop_length": 160, "chunk_length": 30, "n_fft": 400,
        "n_samples": 480000, "nb_max_frames": 3000, "padding_side": "right",
        "padding_value": 0.0, "return_attention_mask": False,
        "processor_class": "WhisperProcessor"}))
    # the heads word timestamps align with (published checkpoints name theirs here)
    (path / "generation_config.json").write_text(json.dumps(
        {"alignment_heads": [[1, 0], [1, 1]]}))
    return path


def whisper_plugin_env(root: Path) -> dict[str, str]:
    """Environment for a subprocess (``mlxbun transcribe``, an ``--isolate`` engine child)
    that finds the whisper plugin by its entry point, as a pip install would write it,
    when this tree's plugin is not installed. ``root``: a scratch directory."""
    import os
    from importlib.metadata import entry_points

    env = dict(os.environ)
    if any(ep.name == "whisper" for ep in entry_points(group="mlxbun")):
        return env
    info = root / "site" / "mlxbun_whisper-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mlxbun-whisper\n"
                                   "Version: 0.1.0\n")
    (info / "entry_points.txt").write_text("[mlxbun]\nwhisper = mlxbun_whisper\n")
    env["PYTHONPATH"] = f"{info.parent}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


def _cleanup() -> None:
    if _root is not None:
        shutil.rmtree(_root, ignore_errors=True)


def tiny_whisper_checkpoint(seed: int = 0) -> Path:
    """Memoized :func:`write_whisper_checkpoint` in a per-process temp dir (removed at
    exit; treat it as read-only: it is shared)."""
    global _root
    with _lock:
        if seed not in _cache:
            if _root is None:
                _root = Path(tempfile.mkdtemp(prefix="mlxbun-whisper-"))
                atexit.register(_cleanup)
            _cache[seed] = write_whisper_checkpoint(_root / f"whisper-tiny-{seed}", seed)
        return _cache[seed]


def speechlike(seconds: float = 2.0, rate: int = 16_000, seed: int = 0) -> np.ndarray:
    """Mono float32 audio that varies like speech: tone bursts at shifting pitches with
    short gaps (a syllable every 0.2 s), so segments and words have something to align."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    pitch = 150 + 250 * rng.random(int(seconds * 5) + 1)[(t * 5).astype(int)]
    envelope = (np.sin(np.pi * (t * 5 % 1)) ** 2) * ((t * 5 % 1) < 0.8)
    return (0.4 * envelope * np.sin(2 * np.pi * pitch * t)).astype(np.float32)


def wav_file(samples: np.ndarray, rate: int = 16_000) -> bytes:
    """16-bit PCM WAV bytes of mono float samples in [-1, 1] (the stdlib ``wave``)."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()
