"""LoRA fine-tuning (SFT, DPO, ORPO) on mlx-lm's tuner.

The submit record is the spec's ``FinetuneSubmit`` (snake_case); the arguments of
mlx-lm's tuner are built from it over ``mlx_lm.lora.CONFIG_DEFAULTS``, so the adapter
directory (``adapter_config.json`` + ``adapters.safetensors``) is mlx-lm's format and
mounts with ``POST /v1/adapters``. SFT trains on mlx-lm's datasets and loss; DPO and ORPO
on ``{prompt, chosen, rejected}`` pairs with our losses (:mod:`.preference_loss`).
"""

from __future__ import annotations

import json
import math
import time
import types
from pathlib import Path
from typing import TYPE_CHECKING, cast

from .. import fspaths
from ..errors import BadRequest
from .events import Emit, JobError

if TYPE_CHECKING:
    import mlx.nn as nn
    from mlx_lm.tokenizer_utils import TokenizerWrapper

DEFAULTS = {"rank": 8, "scale": 20.0, "num_layers": -1, "iters": 100,
            "learning_rate": 2e-4, "max_seq_length": 512, "batch_size": 1,
            "grad_accumulation_steps": 1, "seed": 0, "steps_per_report": 1,
            "steps_per_eval": 50, "val_max_examples": 256, "lora_dropout": 0.0,
            "grad_checkpoint": False, "save_every": 100, "target_modules": None,
            "grad_clip_norm": 1.0, "dpo_beta": 0.1, "dpo_warmup_iters": 0,
            "dpo_lr_schedule": "cosine", "orpo_lambda": 0.1, "orpo_warmup_iters": 0,
            "orpo_lr_schedule": "cosine", "sft_scope": "full", "weight_decay": 0.0,
            "rs_lora": False}
INTS = ("rank", "num_layers", "iters", "max_seq_length", "batch_size", "grad_accumulation_steps",
        "seed", "steps_per_report", "steps_per_eval", "val_max_examples", "save_every",
        "dpo_warmup_iters", "orpo_warmup_iters")
FLOATS = ("scale", "learning_rate", "lora_dropout", "grad_clip_norm", "dpo_beta", "orpo_lambda",
          "weight_decay")
METHODS = ("sft", "dpo", "orpo")
MARGIN_PAIRS = 32  # training pairs whose margin the summary reports, before and after
CHOICES = {"sft_scope": ("full", "response"), "dpo_lr_schedule": ("constant", "cosine"),
           "orpo_lr_schedule": ("constant", "cosine")}
# The reference's knobs with no counterpart here: the value meaning "off" is taken (a whole
# config carries them), anything else is a 400 saying why, never silently dropped.
NOT_BUILT = {
    "segment_size": (0, "segmented backward is not built here; grad_checkpoint (mlx-lm's "
                        "per-layer recompute) is the activation-memory lever"),
    "orpo_flash_ce": (False, "the flash-CCE head is the reference's Metal kernel; the "
                             "preference losses here read the model's own logits"),
    "orpo_fused_ce": (False, "no fused linear-CE head here; the preference losses read the "
                             "model's full logits"),
    "orpo_prefix_shared": (False, "chosen and rejected each run their own forward here (no "
                                  "shared prompt prefix; the loss is the same)"),
    "orpo_chunk_size": (0, "the response head is not token-chunked here; the full logits "
                           "are kept"),
    "lora_plus_ratio": (1, "LoRA+ is not built: every LoRA weight trains at one learning "
                           "rate (1 is the only value taken)"),
}
RANK_SCALING = ("only 'constant' is taken: one rank for every layer, which is what mlx-lm's "
                "adapter_config.json records; by_bits / by_kl would give layers ranks that "
                "mlx-lm's loader cannot mount (rs_lora scales by the rank instead)")


# -- before the job: dataset probe and submit checks (server and CLI) ------------------
def inspect_dataset(path) -> dict:
    """``{ok, n_train, n_valid, format}``: counts and the detected row format; a path
    that is missing or no directory is ``ok: false`` with the reason (a probe's answer,
    not a client error)."""
    try:
        where = fspaths.existing_dir(path, "path")
    except BadRequest as exc:
        if not isinstance(path, str) or not path:
            raise  # no path at all is the client's mistake: a 400
        return {"ok": False, "n_train": 0, "n_valid": 0, "format": "unknown",
                "error": exc.message}
    train = where / "train.jsonl"
    if not train.is_file():
        return {"ok": False, "n_train": 0, "n_valid": 0, "format": "unknown",
                "error": f"{train} not found"}
    n_train, fmt = _count(train)
    n_valid = _count(where / "valid.jsonl")[0] if (where / "valid.jsonl").is_file() else 0
    return {"ok": n_train > 0, "n_train": n_train, "n_valid": n_valid, "format": fmt,
            **({} if n_train else {"error": f"{train} has no rows"})}


def _count(path: Path) -> tuple[int, str]:
    n, fmt = 0, "unknown"
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            if n == 0:
                fmt = row_format(line)
            n += 1
    return n, fmt


def row_format(line: str) -> str:
    try:
        row = json.loads(line)
    except ValueError:
        return "unknown"
    return format_of(row)


def format_of(row: object) -> str:
    """The mlx-lm row format of one parsed row (``unknown`` when none fits)."""
    if not isinstance(row, dict):
        return "unknown"
    if {"prompt", "chosen", "rejected"} <= row.keys():
        return "dpo"
    if "messages" in row:
        return "messages"
    if {"prompt", "completion"} <= row.keys():
        return "prompt-completion"
    if "text" in row:
        return "text"
    return "unknown"


def prepare(body: dict, default_out: Path) -> dict:
    """Check the paths of a submit record (400s) and fill defaults; the numbers are
    checked by the job itself (a bad value is its ``failed`` event)."""
    if not (body.get("model_dir") or body.get("model_id")) or not body.get("data_dir"):
        raise BadRequest("model_dir and data_dir required")
    refuse_not_built(body)
    if body.get("model_dir"):
        model = fspaths.existing_dir(body["model_dir"], "model_dir", needs=[["config.json"]])
    else:  # a model of the local library by id (the web app's picker): never downloads
        from .quantize import locate

        model = locate(body["model_id"])
    data = fspaths.existing_dir(body["data_dir"], "data_dir", needs=[["train.jsonl"]])
    out = fspaths.output_dir(body.get("adapter_path") or default_out, "adapter_path",
                             reusable_if=("adapter_config.json",))
    config = {**DEFAULTS, **{k: v for k, v in body.items() if v is not None and k != "model_id"}}
    config.update(model_dir=str(model), data_dir=str(data), adapter_path=str(out))
    if not config.get("method"):  # preference rows train ORPO (the reference's default)
        config["method"] = "orpo" if inspect_dataset(str(data))["format"] == "dpo" else "sft"
    warm = body.get("warm_start_adapter")
    if warm:
        config["warm_start_adapter"] = str(fspaths.existing_dir(
            warm, "warm_start_adapter", needs=[["adapters.safetensors"]]))
    return config


def refuse_not_built(body: dict) -> None:
    """A 400 naming the first field that asks for something this trainer does not do."""
    for field, (off, why) in NOT_BUILT.items():
        if body.get(field) is not None and body[field] != off:
            raise BadRequest(f"{field}: refused: {why}", param=field)
    if body.get("rank_scaling") not in (None, "constant"):
        raise BadRequest(f"rank_scaling {body['rank_scaling']!r}: refused: {RANK_SCALING}",
                         param="rank_scaling")


# -- the job (child process) -------------------------------------------------------
def _checked(config: dict) -> dict:
    config = {**DEFAULTS, **config}
    method = config.setdefault("method", "sft")
    if method not in METHODS:
        raise JobError(f"unknown method {method!r} (sft, dpo or orpo)")
    for k in INTS:
        if isinstance(config.get(k), bool) or not isinstance(config.get(k), int):
            raise JobError(f"{k} must be an integer")
    for k in FLOATS:
        if isinstance(config.get(k), bool) or not isinstance(config.get(k), (int, float)):
            raise JobError(f"{k} must be a number")
    if not isinstance(config["rs_lora"], bool):
        raise JobError("rs_lora must be true or false")
    for k, allowed in CHOICES.items():
        if config[k] not in allowed:
            raise JobError(f"{k} must be one of {', '.join(allowed)}")
    for k in ("rank", "iters", "max_seq_length", "batch_size", "grad_accumulation_steps",
              "steps_per_report", "steps_per_eval", "save_every"):
        if config[k] < 1:
            raise JobError(f"{k} must be at least 1")
    for k in ("val_max_examples", "dpo_warmup_iters", "orpo_warmup_iters", "grad_clip_norm",
              "weight_decay"):
        if config[k] < 0:
            raise JobError(f"{k} must not be negative")
    for k in ("learning_rate", "scale", "dpo_beta", "orpo_lambda"):
        if config[k] <= 0:
            raise JobError(f"{k} must be positive")
    return config


def _mlx_args(config: dict, fmt: str) -> types.SimpleNamespace:
    from mlx_lm.lora import CONFIG_DEFAULTS

    # rsLoRA: alpha / sqrt(rank), written into lora_parameters so every loader honours it
    scale = float(config["scale"]) / (math.sqrt(config["rank"]) if config["rs_lora"] else 1.0)
    lora = {"rank": config["rank"], "scale": scale, "dropout": float(config["lora_dropout"])}
    if config.get("target_modules"):
        lora["keys"] = list(config["target_modules"])
    examples = config["val_max_examples"]
    args = {**CONFIG_DEFAULTS, "model": config["model_dir"], "data": config["data_dir"],
            "train": True, "fine_tune_type": "lora", "num_layers": config["num_layers"],
            "batch_size": config["batch_size"], "iters": config["iters"],
            "learning_rate": float(config["learning_rate"]), "seed": config["seed"],
            "steps_per_report": config["steps_per_report"],
            "steps_per_eval": config["steps_per_eval"], "save_every": config["save_every"],
            "max_seq_length": config["max_seq_length"], "adapter_path": config["adapter_path"],
            "grad_checkpoint": bool(config["grad_checkpoint"]),
            "grad_accumulation_steps": config["grad_accumulation_steps"],
            "val_batches": max(1, examples // config["batch_size"]) if examples else -1,
            "lora_parameters": lora, "mask_prompt": fmt != "text",
            "resume_adapter_file": (str(Path(config["warm_start_adapter"]) / "adapters.safetensors")
                                    if config.get("warm_start_adapter") else None),
            "method": config["method"], "grad_clip_norm": config["grad_clip_norm"],
            "weight_decay": float(config["weight_decay"]), "rs_lora": config["rs_lora"]}
    if config["method"] == "dpo":
        args["dpo_beta"] = config["dpo_beta"]
    elif config["method"] == "orpo":
        args.update(orpo_lambda=config["orpo_lambda"], sft_scope=config["sft_scope"])
    return types.SimpleNamespace(**args)


class Report:
    """mlx-lm's reports (its ``TrainingCallback`` protocol) as the job's ``metric`` events;
    the loop sets ``emit``."""

    def __init__(self, iters: int):
        self.iters = iters
        self.last: dict[str, float] = {}
        self.emit: Emit = lambda event: None

    def on_train_loss_report(self, info: dict) -> None:
        self.last["train"] = info["train_loss"]
        self.emit({"type": "metric", "kind": "train", "step": info["iteration"],
                   "loss": info["train_loss"], "learning_rate": info["learning_rate"],
                   "tokens_per_sec": info["tokens_per_second"],
                   "iterations_per_sec": info["iterations_per_second"],
                   "trained_tokens": info["trained_tokens"], "peak_memory_gb": info["peak_memory"],
                   "progress": info["iteration"] / self.iters})

    def on_val_loss_report(self, info: dict) -> None:
        self.last["val"] = info["val_loss"]
        self.emit({"type": "metric", "kind": "val", "step": info["iteration"],
                   "loss": info["val_loss"], "val_time_s": info["val_time"]})


def _data_format(config: dict) -> str:
    fmt = inspect_dataset(config["data_dir"])["format"]
    train_jsonl = f"{config['data_dir']}/train.jsonl"
    if config["method"] == "sft" and fmt in ("dpo", "unknown"):
        raise JobError(f"sft needs rows of messages, prompt/completion or text; "
                       f"{train_jsonl} holds {fmt!r} rows (dpo or orpo train on "
                       f"prompt/chosen/rejected rows)")
    if config["method"] != "sft" and fmt != "dpo":
        raise JobError(f"{config['method']} needs rows of prompt, chosen and rejected; "
                       f"{train_jsonl} holds {fmt!r} rows")
    return fmt


def run(config: dict, emit: Emit) -> dict:
    config = _checked(config)
    iters, method = config["iters"], config["method"]

    def stage(name: str, progress: float, message: str) -> None:
        emit({"type": "stage", "stage": name, "progress": progress, "message": message})

    t0 = time.time()
    fmt = _data_format(config)
    stage("load", 0.0, f"loading {config['model_dir']}")
    from mlx_lm.utils import load

    from .train_loop import train_adapter

    # load's annotation is a union of the 2- and 3-tuple; without return_config it is the 2-tuple
    model, tokenizer = cast("tuple[nn.Module, TokenizerWrapper]", load(config["model_dir"]))
    args = _mlx_args(config, fmt)
    stage("dataset", 0.0, "tokenizing the dataset")
    report, summary = Report(iters), {}
    if method == "sft":
        datasets, loss, batches = _sft_datasets(config, tokenizer, args), None, None
    else:
        datasets, loss, batches = _preference(config, tokenizer, emit)
        summary["margin_before"] = _margin(model, datasets[0], config)
    stage("train", 0.0, f"{method}: {iters} steps (LoRA rank {config['rank']})")
    train_adapter(args, config, model, datasets, report, emit, loss=loss, batches=batches)
    if method != "sft":
        summary["margin_after"] = _margin(model, datasets[0], config)
        emit({"type": "log", "line": f"chosen-rejected margin on training pairs: "
              f"{summary['margin_before']:.4f} -> {summary['margin_after']:.4f}"})
    stage("save", 1.0, f"adapter saved to {config['adapter_path']}")
    return {"output_dir": config["adapter_path"], "adapter_path": config["adapter_path"],
            "method": method, "iters": iters, "format": fmt,
            "final_train_loss": report.last.get("train"),
            "final_val_loss": report.last.get("val"), **summary,
            "seconds": round(time.time() - t0, 2)}


def _sft_datasets(config: dict, tokenizer, args: types.SimpleNamespace) -> tuple:
    from mlx_lm.tuner.datasets import CacheDataset, load_local_dataset

    train_set, valid_set, _ = load_local_dataset(
        Path(config["data_dir"]),
        tokenizer,  # annotated as HF's; mlx-lm's trainer passes this too
        args)
    return CacheDataset(train_set), CacheDataset(valid_set)


def _preference(config: dict, tokenizer, emit: Emit) -> tuple:
    """Pairs of train.jsonl / valid.jsonl, the method's loss, and the pair batches."""
    import functools

    from .preference_data import iterate_pairs, load_pairs
    from .preference_loss import for_config

    where, seq = Path(config["data_dir"]), config["max_seq_length"]
    train_pairs, dropped = load_pairs(where / "train.jsonl", tokenizer, seq)
    valid_pairs, dropped_valid = load_pairs(where / "valid.jsonl", tokenizer, seq)
    if dropped or dropped_valid:
        emit({"type": "log", "line": f"left out {dropped + dropped_valid} pairs whose prompt "
              f"alone fills max_seq_length {seq}"})
    if len(train_pairs) < config["batch_size"]:
        raise JobError(f"{len(train_pairs)} usable training pairs, fewer than batch_size "
                       f"{config['batch_size']}")
    batches = functools.partial(iterate_pairs, seed=config["seed"])
    return (train_pairs, valid_pairs), for_config(config), batches


def _margin(model, pairs: list, config: dict) -> float:
    from .preference_data import mean_margin

    return round(mean_margin(model, pairs[:MARGIN_PAIRS], config["max_seq_length"]), 6)


def default_output(home: Path, name: str | None = None) -> Path:
    from ..adapters.discover import adapters_dir

    return adapters_dir(home) / (name or f"adapter-{time.strftime('%Y%m%d-%H%M%S')}")
