"""``mlxbun train`` and ``mlxbun quantize``: the server's job runners, in the
foreground, with a progress bar. The job is recorded in the same store, so
``GET /api/jobs`` lists it too (and ``mlxbun train-watch`` follows it); ``fuse``
folds an adapter into its base."""

from __future__ import annotations

import json
import sys


def add_parsers(sub) -> None:
    t = sub.add_parser("train", help="LoRA fine-tune: SFT, DPO or ORPO")
    t.add_argument("model", nargs="?", default=None,
                   help="checkpoint dir or model name (default: the embedded default model)")
    t.add_argument("--data", required=True, help="dataset dir: train.jsonl (+ valid.jsonl)")
    t.add_argument("--adapter", "--adapter-path", dest="adapter", default=None, metavar="DIR",
                   help="output adapter dir (default: <home>/finetunes/<method>-<model>)")
    t.add_argument("--method", default=None, choices=("sft", "dpo", "orpo"),
                   help="objective (default: orpo on prompt/chosen/rejected rows, else sft)")
    t.add_argument("--iters", type=int, default=100)
    t.add_argument("--lr", type=float, default=None, dest="learning_rate",
                   help="learning rate (default: sft 2e-4, dpo 5e-5, orpo 1e-5)")
    t.add_argument("--rank", type=int, default=8)
    t.add_argument("--scale", type=float, default=20.0)
    t.add_argument("--num-layers", type=int, default=-1, help="last N layers (-1: all)")
    t.add_argument("--seq", type=int, default=512, dest="max_seq_length")
    t.add_argument("--batch", type=int, default=1, dest="batch_size")
    t.add_argument("--grad-accum", type=int, default=1, dest="grad_accumulation_steps")
    t.add_argument("--grad-clip", type=float, default=1.0, dest="grad_clip_norm",
                   help="clip the gradients' global norm to this (0: off)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--val-size", type=int, default=256, dest="val_max_examples",
                   help="validation rows scored per evaluation (0: all)")
    t.add_argument("--beta", type=float, default=0.1, dest="dpo_beta", help="DPO's beta")
    t.add_argument("--lambda", type=float, default=0.1, dest="orpo_lambda",
                   help="ORPO's odds-ratio weight")
    t.add_argument("--sft-scope", default="full", choices=("full", "response"),
                   help="ORPO's chosen-NLL term over prompt+response (full) or the response")
    t.add_argument("--save-every", type=int, default=100)
    t.add_argument("--resume", default=None, metavar="DIR", dest="warm_start_adapter",
                   help="warm-start the LoRA weights from this adapter dir")
    t.add_argument("--weight-decay", type=float, default=0.0, dest="weight_decay",
                   help="AdamW's decoupled weight decay (default 0)")
    t.add_argument("--rs-lora", action="store_true", dest="rs_lora",
                   help="rsLoRA: the LoRA scale divided by sqrt(rank)")
    t.add_argument("--dry-run", action="store_true", help="inspect the dataset, don't train")
    _refuse_reference_flags(t)

    q = sub.add_parser("quantize", help="quantize a checkpoint through mlx-lm's converter")
    q.add_argument("model", help="checkpoint dir or local model name")
    q.add_argument("--bits", type=int, default=4)
    q.add_argument("--group-size", type=int, default=64)
    q.add_argument("--mode", default="affine", help="affine, mxfp4, nvfp4 or mxfp8")
    q.add_argument("--recipe", default=None, help="mixed precision: mixed_2_6, mixed_3_4, "
                                                  "mixed_3_6 or mixed_4_6")
    q.add_argument("--target-bpw", type=float, default=None, metavar="BPW",
                   help="mixed precision to a size: layers raised from --bits to 8 bits, the "
                        "most sensitive first, until the model has this many bits per weight")
    q.add_argument("--out", default=None, help="output dir (default: <home>/models/<name>-<q>)")

    from . import fuse, watch

    watch.add_parser(sub)
    fuse.add_parser(sub)


def _refuse_reference_flags(t) -> None:
    """The reference's memory and head switches: nothing here they could turn on or off."""
    from ..refused_flags import refuse
    from .finetune import NOT_BUILT

    refuse(t, "--seg", reason=NOT_BUILT["segment_size"][1], takes_value=True)
    refuse(t, "--no-segment", reason="names the default here: no segmented backward is built, "
           "all activations stay resident (grad_checkpoint is the memory lever)")
    refuse(t, "--no-flash", reason="names the default here: there is no flash-CCE (or fused) "
           "head to turn off; the preference losses read the model's own logits")
    refuse(t, "--no-prefix", reason="names the default here: chosen and rejected already run "
           "their own forwards (no prefix sharing to turn off)")


TRAIN_FIELDS = ("iters", "rank", "scale", "num_layers", "max_seq_length", "batch_size",
                "grad_accumulation_steps", "grad_clip_norm", "seed", "val_max_examples",
                "dpo_beta", "orpo_lambda", "sft_scope", "save_every", "warm_start_adapter",
                "weight_decay", "rs_lora")
DEFAULT_LR = {"sft": 2e-4, "dpo": 5e-5, "orpo": 1e-5}  # the reference's, per method


def _fail(message: str) -> int:
    print(f"mlxbun: {message}", file=sys.stderr)
    return 2


def cmd_train(args) -> int:
    from ..errors import APIError
    from ..models.paths import mlxbun_home
    from ..models.resolve import ModelNotFound
    from ..selection import resolve
    from . import finetune

    try:
        model = resolve(args.model, progress=True)
    except ModelNotFound as exc:
        return _fail(str(exc))
    home = mlxbun_home()
    try:
        probe = finetune.inspect_dataset(args.data)
        if not probe["ok"]:
            return _fail(probe["error"])
        method = args.method or ("orpo" if probe["format"] == "dpo" else "sft")
        out = args.adapter or str(home / "finetunes" / f"{method}-{model.path.name}")
        body = {k: getattr(args, k) for k in TRAIN_FIELDS}
        body.update(model_dir=str(model.path), data_dir=args.data, adapter_path=out,
                    method=method, learning_rate=args.learning_rate or DEFAULT_LR[method])
        config = finetune.prepare(body, finetune.default_output(home))
    except APIError as exc:
        return _fail(exc.message)
    print(f"mlxbun: {method} on {model.model_id}: {probe['n_train']} train / "
          f"{probe['n_valid']} valid rows ({probe['format']}), {args.iters} steps, rank "
          f"{args.rank} -> {config['adapter_path']}", flush=True)
    if args.dry_run:
        print(json.dumps(config, indent=2))
        return 0
    return _run("finetune", config, total=args.iters)


def cmd_quantize(args) -> int:
    from ..errors import APIError
    from ..models.paths import mlxbun_home
    from . import quantize

    body = {"model_id": args.model, "bits": args.bits, "group_size": args.group_size,
            "mode": args.mode, "recipe": args.recipe, "output_dir": args.out,
            "target_bpw": args.target_bpw}
    try:
        config = quantize.prepare(body, mlxbun_home())
    except APIError as exc:
        return _fail(exc.message)
    return _run("quantize", config, total=None)


def _run(kind: str, config: dict, total) -> int:
    from tqdm import tqdm

    from ..models.paths import mlxbun_home
    from .runner import JobManager
    from .store import JobStore

    home = mlxbun_home()
    manager = JobManager(JobStore(home / "jobs.sqlite"), home)
    # a job without steps (quantize) shows its stages and their share of the work, no rate
    bar = tqdm(total=total or 100, unit="step", dynamic_ncols=True, file=sys.stderr,
               bar_format=None if total else "{desc}: {percentage:3.0f}%|{bar}| {elapsed}{postfix}")

    def show(event: dict) -> None:
        kind_ = event.get("type")
        if kind_ == "metric" and event.get("kind") == "train":
            bar.n = event["step"] if total else int(100 * event.get("progress", 0))
            bar.set_postfix(loss=f"{event['loss']:.3f}",
                            tok_s=f"{event.get('tokens_per_sec', 0):.0f}")
        elif kind_ == "metric":
            bar.write(f"step {event['step']}: val loss {event['loss']:.3f}")
        elif kind_ == "stage":
            if not total and isinstance(event.get("progress"), (int, float)):
                bar.n = int(100 * event["progress"])
                bar.set_postfix_str(event.get("message", "")[-60:], refresh=False)
            bar.set_description(event.get("stage", ""))
            bar.refresh()
        elif kind_ == "failed":
            bar.write(f"failed: {event.get('error')}")

    try:
        row = manager.run(kind, config, show)
    except KeyboardInterrupt:
        bar.close()
        return _fail("interrupted")
    bar.close()
    if row["status"] != "done":
        print(f"mlxbun: job {row['id']} {row['status']}: {row['error']} (log: {row['log_path']})",
              file=sys.stderr)
        return 1
    print(f"mlxbun: job {row['id']} done: {row['output_path']}", flush=True)
    return 0
