"""Tiny random-weight checkpoints in Hugging Face layout, for fast CPU tests.

Configs keep the key schema of published checkpoints (nesting, rope_parameters,
layer_types, MoE fields) scaled down; weights come from mlx-lm's own model
class for the config and are stored under HF names/layouts, so every
``sanitize`` transform (expert stacking, norm shifts, conv transposes, MLA
kv_b_proj splitting, wrapper prefixes) is exercised on load.
"""

from __future__ import annotations

import atexit
import copy
import hashlib
import json
import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from .families import (  # noqa: F401  (re-exported)
    _TF4,
    _TOKENS,
    FAMILY_DEFAULT_EOS,
    FAMILY_SPECIAL_TOKENS,
    SUPPORTED_MODEL_TYPES,
    _default_dtype,
    default_eos,
    family_config,
)
from .hf_layout import to_hf
from .tokenizer import CHATML_TEMPLATE, build_tokenizer
from .weights import random_params


def _merge(base: dict, over: Mapping) -> dict:
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = copy.deepcopy(v)
    return base


# ---------------------------------------------------------------- weights

def _build_weights(model_type: str, config: dict, seed: int, dtype: mx.Dtype):
    from ..models.classes import model_classes

    model_cls, args_cls = model_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(copy.deepcopy(config)))
    params = random_params(model, seed, dtype)
    hf = to_hf(model_type, params, config)
    # Round-trip guard: sanitize must map our HF layout back onto the model exactly.
    back = model.sanitize(dict(hf))
    model.load_weights(list(back.items()), strict=True)
    for k, v in back.items():
        ref = params[k].astype(mx.float32)
        if not mx.allclose(v.astype(mx.float32), ref, atol=1e-2).item():
            raise AssertionError(f"{model_type}: sanitize round-trip changed {k}")
    return hf


def _save_safetensors(path: Path, tensors: Mapping[str, mx.array]) -> None:
    """Deterministic safetensors writer (sorted keys, HF ``format: pt`` metadata)."""
    names = {mx.float32: "F32", mx.bfloat16: "BF16", mx.float16: "F16"}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs, off = [], 0
    for name in sorted(tensors):
        a = tensors[name]
        raw = np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a).tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------- writer

def _dump(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


@dataclass
class _Tokenizer:
    """The tokenizer a checkpoint ships, and the ids its configs name."""

    json_text: str
    added: list  # tokenizer.json's added_tokens
    ids: dict  # special token -> id
    size: int  # tokens in the vocabulary
    config_ids: dict  # bos/eos/pad token ids for config.json and generation_config.json
    bos: str | None
    eos: str
    pad: str | None
    unk: str | None


def _tokenizer(model_type: str, vocab_size: int, special_tokens: Sequence[str],
               eos_token: str | None, bos_token: str | None, media: bool,
               audio: bool) -> _Tokenizer:
    """The family's special tokens (and a media checkpoint's) in a byte-level BPE tokenizer."""
    from . import vision as V

    fam_bos, fam_eos, stops, pad, unk = _TOKENS[model_type]
    bos = bos_token if bos_token is not None else fam_bos
    eos = eos_token if eos_token is not None else fam_eos
    specials = list(special_tokens) or list(FAMILY_SPECIAL_TOKENS[model_type])
    if media:
        media_tokens = V.MEDIA_TOKENS[model_type]
        specials += [t for kind in ("image", "audio") if kind == "image" or audio
                     for t in media_tokens.get(kind, ()) if t not in specials]
    stops = [] if eos_token is not None else [s for s in stops if s in specials]
    specials += [t for t in (bos, eos, pad, unk) if t and t not in specials]

    tok_json = build_tokenizer(vocab_size, specials, bos_token=bos)
    tok = json.loads(tok_json)
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    eos_ids = [ids[eos]] + [ids[s] for s in stops if s != eos]
    eos_val = eos_ids[0] if len(eos_ids) == 1 else eos_ids
    config_ids = {"bos_token_id": ids.get(bos), "eos_token_id": eos_val,
                  "pad_token_id": ids.get(pad)}
    return _Tokenizer(tok_json, tok["added_tokens"], ids, len(tok["model"]["vocab"]),
                      config_ids, bos, eos, pad, unk)


def _config(model_type: str, vocab_size: int, tokens: _Tokenizer, *, media: bool, audio: bool,
            dtype: str | None, config_overrides: Mapping | None) -> dict:
    """The family's config with this tokenizer's ids, media markers, dtype and overrides."""
    from . import vision as V

    cfg = family_config(model_type)
    ids = tokens.ids
    text = cfg.get("text_config", cfg)
    for c in {id(cfg): cfg, id(text): text}.values():
        c["vocab_size"] = vocab_size
        c.update({k: v for k, v in tokens.config_ids.items() if v is not None})
    if "vocab_size_per_layer_input" in text:
        text["vocab_size_per_layer_input"] = vocab_size
    if model_type == "gemma4":
        cfg.update(boi_token_id=ids.get("<|image>"), eoi_token_id=ids.get("<image|>"),
                   image_token_id=ids.get("<|image|>"))
    if model_type in ("qwen3_5", "qwen3_5_moe", "qwen3_vl"):
        cfg.update(image_token_id=ids.get("<|image_pad|>"),
                   video_token_id=ids.get("<|video_pad|>"),
                   vision_start_token_id=ids.get("<|vision_start|>"),
                   vision_end_token_id=ids.get("<|vision_end|>"))
    if media:
        V.media_config(model_type, cfg, ids, audio)
    if (dtype or _default_dtype(model_type)) == "float32":
        for c in (cfg, text):
            for k in ("dtype", "torch_dtype"):
                if k in c:
                    c[k] = "float32"
    _merge(cfg, config_overrides or {})
    text = cfg.get("text_config", cfg)
    if text["vocab_size"] < tokens.size or cfg.get("vocab_size", tokens.size) < tokens.size:
        raise ValueError(f"config vocab_size smaller than tokenizer ({tokens.size})")
    return cfg


def _write_files(path: Path, files: Mapping[str, Any]) -> None:
    """Extra files: bytes and text as they are, anything else as JSON."""
    for name, content in files.items():
        f = path / name
        f.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            f.write_bytes(content)
        elif isinstance(content, str):
            f.write_text(content, encoding="utf-8")
        else:
            _dump(f, content)


def write_checkpoint(
    path,
    model_type: str = "llama",
    *,
    seed: int = 0,
    vocab_size: int = 1024,
    chat_template: str | None = None,
    special_tokens: Sequence[str] = (),
    eos_token: str | None = None,
    bos_token: str | None = None,
    config_overrides: Mapping | None = None,
    generation_config: Mapping | None = None,
    tokenizer_config_extra: Mapping | None = None,
    extra_files: Mapping[str, Any] | None = None,
    dtype: str | None = None,
    vision: bool = False,
    audio: bool = False,
    mtp: str | None = None,
) -> Path:
    """Write a tiny random checkpoint of ``model_type`` into ``path``; return it.

    ``model_type`` is a family key (``SUPPORTED_MODEL_TYPES``); "minicpm5" writes
    model_type "llama", as MiniCPM5 checkpoints do. ``extra_files`` maps relative
    names to str/bytes/JSON-able objects. ``dtype`` defaults to bfloat16 like
    published weights, but float32 for MoE families: MLX's CPU GatherMM
    (switch experts) only runs in float32. ``vision`` adds an image tower and
    processor configs (families in ``vision.MEDIA_TOKENS``), ``audio`` (Gemma 4)
    an audio tower as well, both built with mlx-vlm (see :mod:`.vision`). ``mtp``
    (``qwen3_5``: ``"random"`` or ``"copy"``) adds the ``mtp.*`` multi-token-prediction
    head Qwen3.5 checkpoints ship; for ``glm_moe_dsa`` the MTP layer ``model.layers.{N}``
    GLM-5.x ships (see :mod:`.mtp`).
    """
    from . import vision as V

    media = vision or audio
    tokens = _tokenizer(model_type, vocab_size, special_tokens, eos_token, bos_token, media, audio)
    cfg = _config(model_type, vocab_size, tokens, media=media, audio=audio, dtype=dtype,
                  config_overrides=config_overrides)
    mx_dtype = getattr(mx, dtype or _default_dtype(model_type))
    weights = _weights(model_type, cfg, seed, mx_dtype, mtp=mtp, media=media)
    files = dict(extra_files or {})
    if media:
        media_files = V.media_files(model_type, audio)
        tokenizer_config_extra = {**media_files.pop("_tokenizer", {}),
                                  **(tokenizer_config_extra or {})}
        files = {**media_files, **files}

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    _dump(path / "config.json", cfg)
    _save_safetensors(path / "model.safetensors", weights)
    (path / "tokenizer.json").write_text(tokens.json_text, encoding="utf-8")
    _dump(path / "tokenizer_config.json",
          {**_tokenizer_config(tokens, chat_template), **(tokenizer_config_extra or {})})
    gen = {k: v for k, v in tokens.config_ids.items() if v is not None}
    _dump(path / "generation_config.json",
          {**gen, **(generation_config or {}), "transformers_version": _TF4})
    _write_files(path, files)
    return path


def _weights(model_type: str, cfg: dict, seed: int, dtype: mx.Dtype, *, mtp: str | None,
             media: bool) -> dict[str, mx.array]:
    """The language model's random weights under HF names, with Qwen3.5's MTP head and
    the media towers when asked for."""
    from . import vision as V

    weights = _build_weights(model_type, cfg, seed, dtype)
    if mtp is not None:
        from .mtp import glm_mtp_weights, mtp_weights

        if model_type == "glm_moe_dsa":
            weights.update(glm_mtp_weights(cfg, seed, dtype, mtp, weights))
        else:
            weights.update(mtp_weights(cfg, seed, dtype, mtp))
    if media:
        weights.update(V.tower_weights(model_type, cfg, seed, dtype))
    return weights


def _tokenizer_config(tokens: _Tokenizer, chat_template: str | None) -> dict:
    """tokenizer_config.json as published checkpoints write it (ChatML by default)."""
    return {
        "added_tokens_decoder": {
            str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                              "single_word", "special")}
            for t in tokens.added},
        "bos_token": tokens.bos, "eos_token": tokens.eos, "pad_token": tokens.pad,
        "unk_token": tokens.unk,
        "chat_template": CHATML_TEMPLATE if chat_template is None else chat_template,
        "clean_up_tokenization_spaces": False, "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


# ---------------------------------------------------------------- cache

_cache: dict[str, Path] = {}
_lock = threading.Lock()
_root: Path | None = None


def _cleanup() -> None:
    if _root is not None:
        shutil.rmtree(_root, ignore_errors=True)


def tiny_checkpoint(model_type: str = "llama", *, folder: str | None = None, **kw) -> Path:
    """Memoized :func:`write_checkpoint` into a per-process temp dir (removed at exit).

    ``folder`` starts the directory's name (plugins that claim by name look at it).
    Callers must treat the returned directory as read-only: it is shared.
    """
    global _root
    key = json.dumps([model_type, folder, kw], sort_keys=True, default=repr)
    with _lock:
        if key in _cache:
            return _cache[key]
        if _root is None:
            _root = Path(tempfile.mkdtemp(prefix="mlxbun-ckpt-"))
            atexit.register(_cleanup)
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        out = write_checkpoint(_root / f"{folder or model_type}-{digest}", model_type, **kw)
        _cache[key] = out
        return out


def tiny_reranker_checkpoint(seed: int = 0, **kw) -> Path:
    """A tiny Qwen3-Reranker: a qwen3 checkpoint in a folder named like one, whose
    vocabulary has the "yes" and "no" tokens the reranker's score reads (published
    Qwen3 vocabularies have both; the tiny tokenizer gets them as added tokens)."""
    specials = [*FAMILY_SPECIAL_TOKENS["qwen3"], "yes", "no"]
    return tiny_checkpoint("qwen3", folder="Qwen3-Reranker-tiny", seed=seed,
                           special_tokens=specials, **kw)
