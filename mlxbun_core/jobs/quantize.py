"""Quantize a checkpoint through mlx-lm's converter (``mlx_lm.convert.convert``).

Uniform quantization takes ``bits`` (2, 3, 4, 5, 6, 8) and ``group_size`` (32, 64,
128) in any of mlx-lm's modes (affine, mxfp4, nvfp4, mxfp8); mixed precision is
mlx-lm's recipes (``recipe``: mixed_2_6, mixed_3_4, mixed_3_6, mixed_4_6) or a size
(``target_bpw``: layers raised from ``bits`` to 8 bits, :mod:`.mixed_bits`). The
output is a plain checkpoint directory under ``<home>/models/`` (where mlxbun's
library lists its own models) that ``mlxbun serve <dir>`` loads.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .. import fspaths
from ..errors import BadRequest
from ..loader import read_json
from ..models.paths import model_id_for_dir
from .events import Emit, JobError

if TYPE_CHECKING:
    import mlx.nn as nn
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    QuantPredicate = Callable[[str, nn.Module], bool | dict]

BITS = (2, 3, 4, 5, 6, 8)
GROUP_SIZES = (16, 32, 64, 128)
MODES = ("affine", "mxfp4", "nvfp4", "mxfp8")
RECIPES = ("mixed_2_6", "mixed_3_4", "mixed_3_6", "mixed_4_6")


def locate(model_id) -> Path:
    """A model directory from a path or a locally cached model name (never downloads)."""
    if not isinstance(model_id, str) or not model_id.strip():
        raise BadRequest("model_id required", param="model_id")
    if model_id.startswith(("/", "~", ".")):
        return fspaths.existing_dir(model_id, "model_id", needs=[["config.json"]])
    import os

    from ..models.resolve import ModelNotFound
    from ..selection import resolve

    saved = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"  # inspection and submission never download
    try:
        return Path(resolve(model_id, progress=False).path)
    except ModelNotFound as exc:
        raise BadRequest(str(exc), param="model_id") from exc
    finally:
        if saved is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = saved


def inspect(model_id) -> dict:
    """``{ok, model_id, arch, support, size_gb}`` without reading a tensor."""
    try:
        path = locate(model_id)
    except BadRequest as exc:
        return {"ok": False, "model_id": model_id, "arch": None, "support": False,
                "size_gb": 0.0, "error": exc.message}
    config = read_json(path / "config.json")
    size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    why = _unsupported(config)
    row = {"ok": why is None, "model_id": model_id, "path": str(path),
           "arch": config.get("model_type"), "support": why is None,
           "size_gb": round(size / 1e9, 4)}
    return row if why is None else {**row, "error": why}


def _unsupported(config: dict):
    if config.get("quantization") or config.get("quantization_config"):
        return "the model is already quantized"
    try:
        from ..models.classes import model_classes

        model_classes(config)
    except Exception as exc:  # mlx-lm has no model definition for this type
        return f"mlx-lm cannot load model_type {config.get('model_type')!r}: {exc}"
    return None


def prepare(body: dict, home: Path) -> dict:
    """A submit record checked (400s) and completed with its output directory."""
    if not body.get("model_id"):
        raise BadRequest("model_id required")
    target = body.get("target_bpw")
    if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float))
                               or not 2 <= target <= 16 or body.get("recipe")
                               or body.get("mode", "affine") != "affine"):
        raise BadRequest("target_bpw is a number of bits per weight (2 to 16), affine mode, "
                         "without a recipe", param="target_bpw")
    path = locate(body["model_id"])
    why = _unsupported(read_json(path / "config.json"))
    if why:
        raise BadRequest(f"cannot quantize {body['model_id']}: {why}", param="model_id")
    bits, group, mode = body.get("bits", 4), body.get("group_size", 64), body.get("mode", "affine")
    recipe = body.get("recipe")
    if bits not in BITS:
        raise BadRequest(f"bits must be one of {BITS}", param="bits")
    if group not in GROUP_SIZES:
        raise BadRequest(f"group_size must be one of {GROUP_SIZES}", param="group_size")
    if mode not in MODES:
        raise BadRequest(f"mode must be one of {MODES}", param="mode")
    if recipe is not None and (recipe not in RECIPES or mode != "affine"):
        raise BadRequest(f"recipe must be one of {RECIPES} (affine mode only)", param="recipe")
    suffix = recipe or (f"{target:g}bpw" if target is not None else None) or (
        f"{bits}bit" if mode == "affine" else mode) + (
        "" if group == 64 else f"-g{group}")
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", source_name(path))[:80]
    out = body.get("output_dir") or home / "models" / f"{name}-{suffix}"
    if body.get("output_dir") is None and Path(out).exists():
        out = Path(f"{out}-{time.strftime('%Y%m%d-%H%M%S')}")
    out = fspaths.output_dir(out, "output_dir")
    if out.exists():
        raise BadRequest(f"output_dir: {out} already exists", param="output_dir")
    return {"model_id": body["model_id"], "model_dir": str(path), "bits": bits,
            "group_size": group, "mode": mode, "recipe": recipe, "output_dir": str(out),
            "target_bpw": target}


def source_name(path: Path) -> str:
    """The plain name outputs are named after: the model's id without its owner
    (``SmolLM2-135M-Instruct``, not a conversion folder's ``….Q4_1-<hash>-float32``)."""
    return model_id_for_dir(path).rsplit("/", 1)[-1]


def run(config: dict, emit: Emit) -> dict:
    """mlx-lm's converter, step by step so progress is real: load (lazy), quantize (the
    new weights computed group by group: the long part), save."""
    from mlx_lm.utils import save

    t0 = time.time()
    what = config.get("recipe") or f"{config['bits']}-bit {config['mode']}"
    emit({"type": "stage", "stage": "load", "progress": 0.0,
          "message": f"loading {config['model_dir']}"})
    try:
        model, tokenizer, cfg = _quantized(config)
    except ValueError as exc:
        raise JobError(f"mlx-lm refused: {exc}") from exc
    for done, total in _evaluate(model):
        emit({"type": "stage", "stage": "quantize",
              "progress": round(0.05 + 0.85 * done / total, 3),
              "message": f"{what}, group {config['group_size']}: {done}/{total} tensors"})
    emit({"type": "stage", "stage": "save", "progress": 0.9,
          "message": f"writing {config['output_dir']}"})
    save(config["output_dir"], config["model_dir"], model, tokenizer, cfg)
    out = Path(config["output_dir"])
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    emit({"type": "stage", "stage": "save", "progress": 1.0, "message": f"saved to {out}"})
    return {"output_dir": str(out), "size_bytes": size, "bits": config["bits"],
            "group_size": config["group_size"], "mode": config["mode"],
            "recipe": config.get("recipe"), "seconds": round(time.time() - t0, 2)}


def _quantized(config: dict) -> tuple[nn.Module, TokenizerWrapper, dict[str, Any]]:
    """What ``mlx_lm.convert.convert(quantize=True)`` builds before saving (lazy arrays)."""
    import mlx.core as mx
    from mlx.utils import tree_map_with_path
    from mlx_lm.convert import MODEL_CONVERSION_DTYPES, mixed_quant_predicate_builder
    from mlx_lm.utils import load, quantize_model

    # load's annotation is a union of the 2- and 3-tuple; return_config=True picks the 3-tuple
    model, tokenizer, cfg = cast("tuple[nn.Module, TokenizerWrapper, dict[str, Any]]", load(
        config["model_dir"], return_config=True, lazy=True))
    recipe = config.get("recipe")  # one of prepare's RECIPES or None
    predicate: QuantPredicate | None = None
    if isinstance(recipe, str):
        # mlx-lm annotates the builder's result with a third parameter its predicate lacks
        predicate = cast("QuantPredicate", mixed_quant_predicate_builder(
            recipe, model, config["group_size"]))
    elif config.get("target_bpw") is not None:  # the job's bits, raised to 8 where it pays
        from .mixed_bits import data_free_sensitivities, plan, quantizable

        group, low = config["group_size"], config["bits"]
        sens = data_free_sensitivities(quantizable(model, group), low, 8, group)
        predicate = plan(model, config["target_bpw"], sens, low, 8, group).predicate()
    dtype = cfg.get("torch_dtype") or (cfg.get("text_config") or {}).get("dtype")
    if dtype in MODEL_CONVERSION_DTYPES:
        target = getattr(mx, dtype)
        keep = getattr(model, "cast_predicate", lambda _: True)
        model.update(tree_map_with_path(
            lambda k, v: v.astype(target) if keep(k) and mx.issubdtype(v.dtype, mx.floating)
            else v, model.parameters()))
    model, cfg = quantize_model(model, cfg, config["group_size"], config["bits"],
                                mode=config["mode"], quant_predicate=predicate)
    return model, tokenizer, cfg


def _evaluate(model: nn.Module, parts: int = 50) -> Iterator[tuple[int, int]]:
    """Compute the lazy quantized weights in about ``parts`` slices; yields (done, total)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    leaves = cast("list[tuple[str, mx.array]]", tree_flatten(model.parameters()))
    arrays = [v for _, v in leaves]
    step = max(1, -(-len(arrays) // parts))
    for i in range(0, len(arrays), step):
        mx.eval(arrays[i:i + step])
        yield min(i + step, len(arrays)), len(arrays)
