"""``mlxbun convert``: mlx_lm.convert's verb (HF checkpoint -> MLX, quantized or cast,
through mlx-lm's public ``convert``), plus mixed precision to a size (``--target-bpw``),
and the GGUF import it always did (a ``.gguf`` source).

The source is resolved as every verb resolves a model (a folder, a local query, or a hub
repo id fetched first), and mlx-lm is handed the local folder, so it never reaches the hub
itself. Everything that can be refused is refused before any work: a ``--mlx-path`` that
exists, ``--upload-repo`` without a hub token, a target outside the bits' reach.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DTYPES = ("float16", "bfloat16", "float32")
ROTATION = ("no TurboQuant weight rotation here: folding one means fusing each norm's "
            "weight into the linears after it and turning the residual stream by a seeded "
            "Hadamard rotation, per architecture (an online rotation where it cannot fold), "
            "with the recipe recorded for the loader; none of that is built (serve --kv-quant "
            "turbo rotates the KV cache only)")
OPTIQ_MIX = ("--calibration-mix optiq is the reference's downloaded calibration set; nothing "
             "is downloaded for it here: pass a local file (--calibration-data FILE, .jsonl of "
             "{\"text\"} rows or plain text), or leave it out for data-free sensitivities")


def add_parser(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("convert", help="HF checkpoint -> MLX (quantized, cast, or mixed bits "
                                       "to a size) as mlx_lm.convert; or a GGUF file -> MLX")
    c.add_argument("source", nargs="?", default=None, help="model folder, query, hub repo id "
                   "or a .gguf file (as --hf-path)")
    c.add_argument("out", nargs="?", default=None, help="output folder (as --mlx-path)")
    c.add_argument("--hf-path", "--model", dest="hf_path", default=None)
    c.add_argument("--mlx-path", default=None, help="output folder; must not exist "
                   "(default: mlx_model)")
    c.add_argument("-q", "--quantize", action="store_true", help="quantize (affine by default)")
    c.add_argument("--q-bits", type=int, default=None, help="bits per weight (default 4)")
    c.add_argument("--q-group-size", type=int, default=None, help="group size (default 64)")
    c.add_argument("--q-mode", default="affine", help="affine, mxfp4, nvfp4 or mxfp8")
    c.add_argument("--quant-predicate", default=None, metavar="RECIPE",
                   help="mlx-lm's mixed recipes: mixed_2_6, mixed_3_4, mixed_3_6, mixed_4_6")
    c.add_argument("--dtype", choices=DTYPES, default=None,
                   help="cast the unquantized weights (default: the checkpoint's)")
    c.add_argument("-d", "--dequantize", action="store_true", help="undo a quantization")
    c.add_argument("--target-bpw", type=float, default=None, metavar="BPW",
                   help="mixed precision: per-layer bits so the model lands at this many bits "
                        "per weight (implies -q)")
    c.add_argument("--candidate-bits", default="4,8", metavar="LOW,HIGH",
                   help="the two bit widths --target-bpw chooses between (default 4,8)")
    c.add_argument("--calibration-data", "--calibration-mix", dest="calibration", default=None,
                   metavar="FILE", help="local .jsonl ({\"text\"} rows) or text for "
                   "--target-bpw's sensitivities (default: data-free, from the weights)")
    c.add_argument("--n-calibration", type=int, default=32, metavar="N",
                   help="calibration rows (default 32)")
    c.add_argument("--upload-repo", default=None, metavar="OWNER/NAME",
                   help="push the result to the hub (a token is checked before any work)")
    from ..refused_flags import refuse

    refuse(c, "--rotate-weights", reason=ROTATION)
    refuse(c, "--rotation-seed", reason=ROTATION, takes_value=True)


def _fail(message: str) -> int:
    print(f"mlxbun: convert: {message}", file=sys.stderr)
    return 2


def cmd_convert(args: argparse.Namespace) -> int:
    source = args.hf_path or args.source
    if not source:
        return _fail("name a source: a model folder, a query, a hub repo id or a .gguf file")
    out = Path(args.mlx_path or args.out or "mlx_model")
    if source.lower().endswith(".gguf"):
        from ..models.gguf import convert_gguf

        print(convert_gguf(source, out))
        return 0
    why = _refusal(args, out)
    if why:
        return _fail(why)
    try:
        model_dir = _resolve(source)
        predicate = _mixed(args, model_dir) if args.target_bpw is not None else (
            args.quant_predicate)
        _run_mlx_lm(args, model_dir, out, predicate)
    except (ValueError, OSError) as exc:
        return _fail(str(exc))
    print(f"mlxbun: converted {source} -> {out}")
    return _upload(args.upload_repo, out) if args.upload_repo else 0


def _refusal(args: argparse.Namespace, out: Path) -> str | None:
    """Why this command cannot work, said before anything is loaded."""
    if args.calibration == "optiq" and not Path("optiq").exists():
        return OPTIQ_MIX
    if out.exists():
        return f"{out} already exists (mlx_lm.convert never writes over a folder)"
    if args.target_bpw is not None and args.quant_predicate:
        return "--target-bpw and --quant-predicate both choose the bits: pass one"
    if args.target_bpw is not None and args.q_mode != "affine":
        return "--target-bpw mixes affine bits: --q-mode must be affine"
    if args.dequantize and (args.quantize or args.target_bpw is not None):
        return "-d/--dequantize and quantizing are opposites: pass one"
    if args.upload_repo:
        from ..hub import remote

        try:
            remote.check_repo_id(args.upload_repo, "upload_repo")
        except Exception as exc:
            return str(getattr(exc, "message", exc))
        if remote.token() is None:
            return ("--upload-repo needs a hub write token (`hf auth login`, HF_TOKEN, or "
                    "the web app's Settings); nothing was converted")
    return None


def _resolve(source: str) -> Path:
    from ..models.resolve import ModelNotFound
    from ..selection import resolve

    try:
        return Path(resolve(source, progress=True).path)
    except ModelNotFound as exc:
        raise ValueError(str(exc)) from exc


def _mixed(args: argparse.Namespace, model_dir: Path):  # -> the plan's predicate
    from ..jobs.mixed_bits import target_plan

    try:
        low, high = (int(b) for b in args.candidate_bits.split(","))
    except ValueError:
        raise ValueError(f"--candidate-bits takes LOW,HIGH (like 4,8): got "
                         f"{args.candidate_bits!r}") from None
    group = args.q_group_size or 64
    calibration = Path(args.calibration) if args.calibration else None
    plan = target_plan(model_dir, args.target_bpw, bits=(low, high), group_size=group,
                       calibration=calibration, samples=args.n_calibration)
    args.quantize, args.q_bits, args.q_group_size = True, low, group
    print(f"mlxbun: convert: {len(plan.high)} layers at {high} bits, the rest at {low}: "
          f"{plan.bpw:.3f} bits per weight (target {args.target_bpw}; this model reaches "
          f"{plan.reachable[0]:.3f} to {plan.reachable[1]:.3f}; sensitivities "
          f"{'from ' + str(calibration) if calibration else 'data-free'})", file=sys.stderr)
    return plan.predicate()


def _run_mlx_lm(args: argparse.Namespace, model_dir: Path, out: Path, predicate) -> None:
    import importlib
    from contextlib import redirect_stdout

    convert = importlib.import_module("mlx_lm.convert").convert  # the module, not the package's
    with redirect_stdout(sys.stderr):  # mlx-lm's [INFO] lines: progress, not the result
        convert(str(model_dir), mlx_path=str(out), quantize=args.quantize,
                q_group_size=args.q_group_size, q_bits=args.q_bits, q_mode=args.q_mode,
                dtype=args.dtype, dequantize=args.dequantize, quant_predicate=predicate)


def _upload(repo: str, out: Path) -> int:
    from ..errors import APIError
    from ..hub import push
    from ..jobs.events import JobError

    try:
        config = push.prepare({"repo_id": repo, "source_path": str(out)}, "model", None)
        url = push.upload(config, None)
    except (APIError, JobError) as exc:
        return _fail(f"converted to {out}, but the upload failed: "
                     f"{getattr(exc, 'message', exc)}")
    print(f"mlxbun: uploaded {out} to {url}")
    return 0
