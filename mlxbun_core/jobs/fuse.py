"""``mlxbun fuse``: fold a LoRA adapter into its base model's weights, as ``mlx_lm.fuse``.

mlx-lm's loader mounts the adapter (``load(..., adapter_path=)``), each LoRA layer's own
``fuse()`` folds its delta into the linear (a quantized base is re-quantized with its own
bits and group size), and mlx-lm's ``save`` writes a standalone snapshot (weights, config,
tokenizer) that ``mlxbun serve`` loads. ``mlx_lm.fuse``'s other flags (dequantize, GGUF
export, upload) are refused, not ignored.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, cast

REFUSED = {"--de-quantize": "dequantizing", "--dequantize": "dequantizing",
           "--export-gguf": "GGUF export", "--gguf-path": "GGUF export",
           "--upload-repo": "uploading (use `mlxbun upload --path DIR` afterwards)"}


def add_parser(sub) -> None:
    f = sub.add_parser("fuse", help="merge a LoRA adapter into the base weights "
                                    "(a standalone model dir)")
    f.add_argument("model", nargs="?", default=None,
                   help="base model: checkpoint dir or model name (or --model)")
    f.add_argument("--model", dest="model_flag", default=None, help=argparse.SUPPRESS)
    f.add_argument("--adapter", "--adapter-path", dest="adapter", default="adapters",
                   metavar="DIR", help="adapter dir: adapters.safetensors + adapter_config.json "
                                       "(default: adapters)")
    f.add_argument("--save-path", default="fused_model", metavar="DIR",
                   help="output dir (default: fused_model)")
    for flag in REFUSED:
        f.add_argument(flag, dest=f"refused_{flag.strip('-').replace('-', '_')}", nargs="?",
                       const=True, default=None, help=argparse.SUPPRESS)


def _fail(message: str) -> int:
    print(f"mlxbun: {message}", file=sys.stderr)
    return 2


def cmd_fuse(args) -> int:
    from ..errors import APIError
    from ..fspaths import existing_dir, output_dir
    from ..models.resolve import ModelNotFound
    from ..selection import report_selection_error, resolve

    for flag, what in REFUSED.items():
        if getattr(args, f"refused_{flag.strip('-').replace('-', '_')}") is not None:
            return _fail(f"fuse {flag}: {what} is not implemented (mlx_lm.fuse's flag)")
    if args.model and args.model_flag and args.model != args.model_flag:
        return _fail("fuse: name the model once (positional or --model)")
    try:
        model = resolve(args.model or args.model_flag, progress=True)
    except ModelNotFound as exc:
        return report_selection_error(exc)
    try:
        adapter = existing_dir(args.adapter, "--adapter",
                               needs=[["adapters.safetensors"], ["adapter_config.json"]])
        out = output_dir(args.save_path, "--save-path")
    except APIError as exc:
        return _fail(exc.message)
    if out == model.path.resolve():
        return _fail("--save-path is the base model's own directory")
    layers = fuse(model.path, adapter, out)
    print(f"mlxbun: fused {adapter} into {model.model_id} ({layers} layers) -> {out}", flush=True)
    return 0


def fuse(model_path: Path, adapter: Path, out: Path) -> int:
    """Write base + adapter as one model at ``out``; the number of layers fused."""
    from mlx.utils import tree_unflatten
    from mlx_lm.utils import load, save

    model, tokenizer, config = cast("tuple[Any, Any, dict[str, Any]]", load(
        str(model_path), adapter_path=str(adapter), return_config=True))
    fused = [(name, m.fuse()) for name, m in model.named_modules() if hasattr(m, "fuse")]
    if fused:
        model.update_modules(tree_unflatten(fused))
    save(out, model_path, model, tokenizer, config, donate_model=False)
    return len(fused)
