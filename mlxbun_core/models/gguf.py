"""Convert a GGUF file into a Hugging Face layout checkpoint that `mlx_lm.load` reads.

mlx-lm cannot import GGUF, and the only real models reachable offline ship as GGUF, so we
dequantize every tensor with the `gguf` package and rebuild config + tokenizer from metadata.
Architectures plug in through `ARCHS` (gguf arch -> config builder, tensor-name map, fix-ups).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["convert_gguf", "UnsupportedGGUF", "ARCHS"]


class UnsupportedGGUF(ValueError):
    """The GGUF uses an architecture / tokenizer we do not know how to rebuild."""


# ---------------------------------------------------------------- metadata

def _fields(reader) -> dict:
    """Plain python values for every metadata key (strings decoded, arrays as lists)."""
    out = {}
    for k, f in reader.fields.items():
        try:
            out[k] = f.contents()
        except Exception:  # pragma: no cover - exotic field types we never need
            continue
    return out


# ---------------------------------------------------------------- architectures

_LAYER_MAP = {  # gguf per-block suffix -> HF suffix (llama-family naming)
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_MAP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def _hf_name(name: str, layer_map: dict) -> str | None:
    """Map `blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; None = drop."""
    m = re.fullmatch(r"blk\.(\d+)\.(.+)\.(weight|bias)", name)
    if m:
        hf = layer_map.get(m.group(2))
        return None if hf is None else f"model.layers.{m.group(1)}.{hf}.{m.group(3)}"
    base, _, kind = name.rpartition(".")
    hf = _GLOBAL_MAP.get(base)
    return None if hf is None else f"{hf}.{kind}"


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (it interleaves rope halves per head)."""
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _llama_config(md: dict, a: str) -> dict:
    heads = md[f"{a}.attention.head_count"]
    cfg = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": md[f"{a}.embedding_length"],
        "intermediate_size": md[f"{a}.feed_forward_length"],
        "num_hidden_layers": md[f"{a}.block_count"],
        "num_attention_heads": heads,
        "num_key_value_heads": md.get(f"{a}.attention.head_count_kv", heads),
        "rms_norm_eps": float(md[f"{a}.attention.layer_norm_rms_epsilon"]),
        "rope_theta": float(md.get(f"{a}.rope.freq_base", 10000.0)),
        "max_position_embeddings": md.get(f"{a}.context_length", 2048),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
    }
    if f"{a}.attention.key_length" in md:
        cfg["head_dim"] = md[f"{a}.attention.key_length"]
    return cfg


def _llama_fix(name: str, w: np.ndarray, cfg: dict) -> np.ndarray:
    if name.endswith("q_proj.weight"):
        return _unpermute(w, cfg["num_attention_heads"])
    if name.endswith("k_proj.weight"):
        return _unpermute(w, cfg["num_key_value_heads"])
    return w


def _gemma3_config(md: dict, a: str) -> dict:
    heads = md[f"{a}.attention.head_count"]
    head_dim = md.get(f"{a}.attention.key_length", 256)
    return {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "hidden_size": md[f"{a}.embedding_length"],
        "intermediate_size": md[f"{a}.feed_forward_length"],
        "num_hidden_layers": md[f"{a}.block_count"],
        "num_attention_heads": heads,
        "num_key_value_heads": md.get(f"{a}.attention.head_count_kv", heads),
        "head_dim": head_dim,
        "query_pre_attn_scalar": head_dim,
        "rms_norm_eps": float(md[f"{a}.attention.layer_norm_rms_epsilon"]),
        "rope_theta": float(md.get(f"{a}.rope.freq_base", 1_000_000.0)),
        "rope_local_base_freq": 10000.0,
        "sliding_window": md.get(f"{a}.attention.sliding_window", 512),
        "sliding_window_pattern": 6,
        "max_position_embeddings": md.get(f"{a}.context_length", 32768),
        "hidden_activation": "gelu_pytorch_tanh",
    }


def _gemma3_fix(name: str, w: np.ndarray, cfg: dict) -> np.ndarray:
    # llama.cpp folds Gemma's (1 + w) into norm weights; HF/mlx-lm add the 1 at runtime.
    return w - 1.0 if name.endswith("norm.weight") else w


_GEMMA3_LAYERS = {**_LAYER_MAP,
                  "post_attention_norm": "post_attention_layernorm",
                  "ffn_norm": "pre_feedforward_layernorm",
                  "post_ffw_norm": "post_feedforward_layernorm"}


@dataclass(frozen=True)
class Arch:
    """How one gguf `general.architecture` maps onto an HF/mlx-lm model."""
    config: Callable[[dict, str], dict]
    layer_map: dict = field(default_factory=lambda: dict(_LAYER_MAP))
    fix: Callable[[str, np.ndarray, dict], np.ndarray] = lambda n, w, c: w


ARCHS: dict[str, Arch] = {
    "llama": Arch(_llama_config, fix=_llama_fix),
    "gemma3": Arch(_gemma3_config, _GEMMA3_LAYERS, _gemma3_fix),
}


# ---------------------------------------------------------------- tokenizer

_PRE_REGEX = {  # tokenizer.ggml.pre -> split regex applied before byte-level (None = GPT-2's own)
    # contractions | letters | digits (three at a time / one at a time) | punctuation | newlines
    # | trailing spaces | other spaces
    "llama-bpe": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "qwen2": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
}


def _tok_str(md: dict, key: str) -> str | None:
    i = md.get(key)
    return None if i is None else md["tokenizer.ggml.tokens"][i]


def _build_tokenizer(md: dict):
    """Byte-level BPE from ggml tokens + merges, with control tokens registered as specials."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )

    kind = md.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise UnsupportedGGUF(f"GGUF tokenizer model {kind!r} is not supported yet "
                              "(only byte-level BPE 'gpt2'; SentencePiece 'llama' models "
                              "such as Gemma need a merges rebuild)")
    tokens = md["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in md.get("tokenizer.ggml.merges", [])]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                               fuse_unk=False, byte_fallback=False))
    pre = md.get("tokenizer.ggml.pre", "default")
    seq: list[pre_tokenizers.PreTokenizer] = []
    if pre == "smollm":
        seq.append(pre_tokenizers.Digits(individual_digits=True))
    if pre in _PRE_REGEX:
        seq += [pre_tokenizers.Split(Regex(_PRE_REGEX[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    else:
        seq.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(seq)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    types = md.get("tokenizer.ggml.token_type", [1] * len(tokens))
    # 3 = control (special), 4 = user-defined (added but not special)
    tok.add_tokens([AddedToken(t, special=True, normalized=False)
                    for t, ty in zip(tokens, types) if ty == 3])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(tokens, types) if ty == 4])
    return tok


def _tokenizer_files(md: dict, out: Path) -> dict:
    """Write tokenizer.json + tokenizer_config.json.

    Returns the bos/eos/pad ids for generation_config.
    """
    _build_tokenizer(md).save(str(out / "tokenizer.json"))
    ids = {k: md.get(f"tokenizer.ggml.{g}_token_id")
           for k, g in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"), ("unk", "unknown"))}
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": _tok_str(md, "tokenizer.ggml.bos_token_id"),
        "eos_token": _tok_str(md, "tokenizer.ggml.eos_token_id"),
        "pad_token": _tok_str(md, "tokenizer.ggml.padding_token_id"),
        "unk_token": _tok_str(md, "tokenizer.ggml.unknown_token_id"),
        "add_bos_token": bool(md.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(md.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 30,
    }
    if "tokenizer.chat_template" in md:
        cfg["chat_template"] = md["tokenizer.chat_template"]
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return ids


# ---------------------------------------------------------------- conversion

QUANT_GROUP = 32  # GGUF's own block size for Q4_*/Q5_*/Q8_0 (K-quants use 32-wide sub-blocks)


def convert_gguf(gguf_path, out_dir, *, precision: str = "float32", progress: bool = True,
                 source: dict | None = None) -> Path:
    """Dequantize `gguf_path` into an HF-layout dir at `out_dir` (written atomically) and return it.

    ``precision``: ``float32`` (the default: the MLX CPU backend's fast path with an
    optimized BLAS), ``float16``/``bfloat16``, or ``q<bits>`` for MLX quantized weights
    (group size 32) as Metal and CUDA prefer. ``source`` is recorded in ``mlxbun_source.json``.
    """
    import gguf
    import mlx.core as mx

    from .gguf_cache import check_magic

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    check_magic(gguf_path)
    reader = gguf.GGUFReader(str(gguf_path))
    md = _fields(reader)
    arch_name = _arch_name(md, gguf_path)
    arch = ARCHS[arch_name]
    cfg = arch.config(md, arch_name)
    bits = int(precision[1:]) if precision.startswith("q") else None
    mx_dtype = mx.float16 if bits else getattr(mx, precision)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp is 0700; the final checkpoint should look like any other dir
    try:
        ids = _tokenizer_files(md, tmp)  # fail fast on tokenizer before the slow tensor pass
        weights = _convert_tensors(reader, arch, cfg, mx_dtype, bits, progress=progress,
                                   desc=f"converting {gguf_path.name}")
        _finish_config(cfg, md, arch_name, weights, ids, precision, bits)
        _write_model(tmp, cfg, weights, ids)
        (tmp / "mlxbun_source.json").write_text(json.dumps(
            {"gguf": str(gguf_path.resolve()), "name": md.get("general.name"),
             "precision": precision, **(source or {})}))
        _publish(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _arch_name(md: dict, gguf_path: Path) -> str:
    """The file's ``general.architecture``, which must be one of :data:`ARCHS`."""
    arch_name = md.get("general.architecture")
    if not isinstance(arch_name, str) or arch_name not in ARCHS:
        raise UnsupportedGGUF(f"{gguf_path.name}: GGUF architecture {arch_name!r} is not supported "
                              f"(supported: {', '.join(sorted(ARCHS))})")
    return arch_name


def _convert_tensors(reader, arch: Arch, cfg: dict, dtype, bits: int | None, *, progress: bool,
                     desc: str) -> dict:
    """Every tensor the architecture keeps, dequantized, under its HF name, fixed up and
    stored in ``dtype`` (or quantized to ``bits``)."""
    import mlx.core as mx
    from gguf.quants import dequantize
    from tqdm import tqdm

    weights = {}
    for t in tqdm(reader.tensors, desc=desc, unit="tensor", disable=not progress, leave=False):
        name = _hf_name(t.name, arch.layer_map)
        if name is None:
            continue
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = w.reshape([int(d) for d in reversed(t.shape)])  # gguf lists dims innermost-first
        weights.update(_stored(name, mx.array(arch.fix(name, w, cfg)), dtype, bits))
    return weights


def _finish_config(cfg: dict, md: dict, arch_name: str, weights: dict, ids: dict,
                   precision: str, bits: int | None) -> None:
    """What config.json learns from the converted weights, the precision and the tokenizer."""
    embed_rows = weights["model.embed_tokens.weight"].shape[0]
    cfg["vocab_size"] = int(md.get(f"{arch_name}.vocab_size", embed_rows))
    cfg["tie_word_embeddings"] = "lm_head.weight" not in weights
    cfg["torch_dtype"] = "float16" if bits else precision
    if bits:
        cfg["quantization"] = {"group_size": QUANT_GROUP, "bits": bits}
    cfg.update({f"{k}_token_id": ids[k] for k in ("bos", "eos", "pad") if ids[k] is not None})


def _write_model(out: Path, cfg: dict, weights: dict, ids: dict) -> None:
    """model.safetensors, config.json and generation_config.json into ``out``."""
    import mlx.core as mx

    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    gen = {k: v for k, v in (("bos_token_id", ids["bos"]), ("eos_token_id", ids["eos"]),
                             ("pad_token_id", ids["pad"])) if v is not None}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))


def _stored(name: str, w, dtype, bits: int | None) -> dict:
    """One converted tensor as stored: cast, or (a matrix, with ``bits``) MLX-quantized
    into ``weight``/``scales``/``biases`` the way mlx-lm's loader expects."""
    import mlx.core as mx

    if bits and w.ndim == 2 and name.endswith(".weight") and w.shape[-1] % QUANT_GROUP == 0:
        q, scales, biases = mx.quantize(w.astype(dtype), group_size=QUANT_GROUP, bits=bits)
        stem = name[: -len("weight")]
        return {name: q, stem + "scales": scales, stem + "biases": biases}
    return {name: w.astype(dtype)}


def _publish(tmp: Path, out_dir: Path) -> None:
    """Move a finished conversion into place; an older one is replaced with no gap."""
    if out_dir.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        os.replace(out_dir, old / "x")
        os.replace(tmp, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out_dir)
