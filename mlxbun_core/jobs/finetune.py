"""LoRA fine-tuning through mlx-lm's own trainer (``mlx_lm.lora.train_model``).

The submit record is the spec's ``FinetuneSubmit`` (snake_case); what mlx-lm's
trainer takes is built from it over ``mlx_lm.lora.CONFIG_DEFAULTS``, so the
adapter directory it writes (``adapter_config.json`` + ``adapters.safetensors``)
is mlx-lm's format and mounts with ``POST /v1/adapters``. SFT only: mlx-lm has no
preference objectives, so DPO/ORPO fail with a message naming the missing library.
"""

from __future__ import annotations

import importlib.util
import json
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

DEFAULTS = {"method": "sft", "rank": 8, "scale": 20.0, "num_layers": -1, "iters": 100,
            "learning_rate": 2e-4, "max_seq_length": 512, "batch_size": 1,
            "grad_accumulation_steps": 1, "seed": 0, "steps_per_report": 1,
            "steps_per_eval": 50, "val_max_examples": 256, "lora_dropout": 0.0,
            "grad_checkpoint": False, "save_every": 100, "target_modules": None}
INTS = ("rank", "num_layers", "iters", "max_seq_length", "batch_size", "grad_accumulation_steps",
        "seed", "steps_per_report", "steps_per_eval", "val_max_examples", "save_every")
FLOATS = ("scale", "learning_rate", "lora_dropout")
PREFERENCE = ("dpo", "orpo")
PREFERENCE_LIBRARY = "mlx-lm-lora"


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
    warm = body.get("warm_start_adapter")
    if warm:
        config["warm_start_adapter"] = str(fspaths.existing_dir(
            warm, "warm_start_adapter", needs=[["adapters.safetensors"]]))
    return config


# -- the job (child process) -------------------------------------------------------
def _checked(config: dict) -> dict:
    method = config.get("method", "sft")
    if method in PREFERENCE:
        have = importlib.util.find_spec(PREFERENCE_LIBRARY.replace("-", "_")) is not None
        raise JobError(f"method {method!r} is not available: mlx-lm's trainer provides SFT only, "
                       f"and preference training needs the {PREFERENCE_LIBRARY} package "
                       + ("(installed, but mlxbun does not drive it yet)" if have else
                          f"(not installed: pip install {PREFERENCE_LIBRARY})"))
    if method != "sft":
        raise JobError(f"unknown method {method!r} (sft, dpo or orpo)")
    for k in INTS:
        if isinstance(config.get(k), bool) or not isinstance(config.get(k), int):
            raise JobError(f"{k} must be an integer")
    for k in FLOATS:
        if isinstance(config.get(k), bool) or not isinstance(config.get(k), (int, float)):
            raise JobError(f"{k} must be a number")
    for k in ("rank", "iters", "max_seq_length", "batch_size", "grad_accumulation_steps",
              "steps_per_report", "steps_per_eval", "save_every"):
        if config[k] < 1:
            raise JobError(f"{k} must be at least 1")
    if config["learning_rate"] <= 0 or config["scale"] <= 0:
        raise JobError("learning_rate and scale must be positive")
    return config


def _mlx_args(config: dict, fmt: str):
    from mlx_lm.lora import CONFIG_DEFAULTS

    lora = {"rank": config["rank"], "scale": float(config["scale"]),
            "dropout": float(config["lora_dropout"])}
    if config.get("target_modules"):
        lora["keys"] = list(config["target_modules"])
    args = {**CONFIG_DEFAULTS, "model": config["model_dir"], "data": config["data_dir"],
            "train": True, "fine_tune_type": "lora", "num_layers": config["num_layers"],
            "batch_size": config["batch_size"], "iters": config["iters"],
            "learning_rate": float(config["learning_rate"]), "seed": config["seed"],
            "steps_per_report": config["steps_per_report"],
            "steps_per_eval": config["steps_per_eval"], "save_every": config["save_every"],
            "max_seq_length": config["max_seq_length"], "adapter_path": config["adapter_path"],
            "grad_checkpoint": bool(config["grad_checkpoint"]),
            "grad_accumulation_steps": config["grad_accumulation_steps"],
            "val_batches": max(1, config["val_max_examples"] // config["batch_size"]),
            "lora_parameters": lora, "mask_prompt": fmt != "text",
            "resume_adapter_file": (str(Path(config["warm_start_adapter"]) / "adapters.safetensors")
                                    if config.get("warm_start_adapter") else None)}
    return types.SimpleNamespace(**args)


def run(config: dict, emit: Emit) -> dict:
    config = _checked(config)
    iters = config["iters"]

    def stage(name: str, progress: float, message: str) -> None:
        emit({"type": "stage", "stage": name, "progress": progress, "message": message})

    t0 = time.time()
    fmt = inspect_dataset(config["data_dir"])["format"]
    if fmt in ("dpo", "unknown"):
        raise JobError(f"sft needs rows of messages, prompt/completion or text; "
                       f"{config['data_dir']}/train.jsonl holds {fmt!r} rows")
    stage("load", 0.0, f"loading {config['model_dir']}")
    from mlx_lm.lora import train_model
    from mlx_lm.tuner.callbacks import TrainingCallback
    from mlx_lm.tuner.datasets import load_local_dataset
    from mlx_lm.utils import load

    # load's annotation is a union of the 2- and 3-tuple; without return_config it is the 2-tuple
    model, tokenizer = cast("tuple[nn.Module, TokenizerWrapper]", load(config["model_dir"]))
    args = _mlx_args(config, fmt)
    stage("dataset", 0.0, "tokenizing the dataset")
    train_set, valid_set, _ = load_local_dataset(
        Path(config["data_dir"]),
        tokenizer,  # type: ignore[arg-type]  # annotated as HF's; mlx-lm's trainer passes this too
        args)
    last: dict = {}

    class Report(TrainingCallback):
        def on_train_loss_report(self, info: dict) -> None:
            last["train"] = info["train_loss"]
            emit({"type": "metric", "kind": "train", "step": info["iteration"],
                  "loss": info["train_loss"], "learning_rate": info["learning_rate"],
                  "tokens_per_sec": info["tokens_per_second"],
                  "iterations_per_sec": info["iterations_per_second"],
                  "trained_tokens": info["trained_tokens"], "peak_memory_gb": info["peak_memory"],
                  "progress": info["iteration"] / iters})

        def on_val_loss_report(self, info: dict) -> None:
            last["val"] = info["val_loss"]
            emit({"type": "metric", "kind": "val", "step": info["iteration"],
                  "loss": info["val_loss"], "val_time_s": info["val_time"]})

    stage("train", 0.0, f"training {iters} steps (LoRA rank {config['rank']})")
    train_model(args, model, train_set, valid_set, Report())
    stage("save", 1.0, f"adapter saved to {config['adapter_path']}")
    return {"output_dir": config["adapter_path"], "adapter_path": config["adapter_path"],
            "iters": iters, "format": fmt, "final_train_loss": last.get("train"),
            "final_val_loss": last.get("val"), "seconds": round(time.time() - t0, 2)}


def default_output(home: Path, name: str | None = None) -> Path:
    from ..adapters.discover import adapters_dir

    return adapters_dir(home) / (name or f"adapter-{time.strftime('%Y%m%d-%H%M%S')}")
