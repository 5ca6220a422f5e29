"""One LoRA training loop for every method, on mlx-lm's tuner (its public API only).

``linear_to_lora_layers`` adapts the model, ``train`` runs the steps with the method's
loss and batch iterator (mlx-lm's own for SFT, :mod:`.preference_loss` and
:mod:`.preference_data` for DPO/ORPO), and the adapter directory is mlx-lm's format
(``adapter_config.json`` + ``adapters.safetensors``) whatever the method. What mlx-lm's
``train_model`` lacks is added around ``train``: global-norm gradient clipping (through
the optimizer, AdamW with the config's ``weight_decay``), the learning-rate schedule of the
preference methods, and a ``metrics.jsonl`` of the run's metric events in the adapter directory.
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim

from .events import Emit

OptimizerT = TypeVar("OptimizerT", bound=optim.Optimizer)


def clipped(optimizer: type[OptimizerT], max_norm: float) -> type[OptimizerT]:
    """``optimizer`` whose gradients are clipped to a global L2 norm of ``max_norm``
    before each update (0: no clipping)."""
    if max_norm <= 0:
        return optimizer

    # a subclass of the optimizer class the caller picked (a variable, to mypy)
    class Clipped(optimizer):  # type: ignore[valid-type, misc]
        def apply_gradients(self, gradients: dict, parameters: dict) -> dict:
            gradients, _ = optim.clip_grad_norm(gradients, max_norm)
            return super().apply_gradients(gradients, parameters)

    Clipped.__name__ = f"Clipped{optimizer.__name__}"
    return Clipped


def learning_rate(config: dict) -> Any:
    """A float for SFT and ``constant``; cosine decay over the run (after an optional
    linear warmup) for a preference method whose schedule is ``cosine``."""
    method, lr = config["method"], float(config["learning_rate"])
    if method == "sft" or config.get(f"{method}_lr_schedule", "cosine") != "cosine":
        return lr
    from mlx_lm.tuner.utils import build_schedule

    warmup = int(config.get(f"{method}_warmup_iters") or 0)
    return build_schedule({"name": "cosine_decay", "warmup": warmup,
                           "arguments": [lr, max(1, config["iters"] - warmup)]})


def adapt(model: nn.Module, args: types.SimpleNamespace) -> None:
    """Freeze the model, put LoRA on its linears, load the warm start's weights."""
    from mlx_lm.tuner.utils import linear_to_lora_layers

    mx.random.seed(args.seed)
    model.freeze()
    layers = len(getattr(model, "layers", []))
    if args.num_layers > layers:
        from .events import JobError

        raise JobError(f"num_layers {args.num_layers} is more than the model's {layers}")
    linear_to_lora_layers(model, args.num_layers, args.lora_parameters)
    if args.resume_adapter_file:
        model.load_weights(args.resume_adapter_file, strict=False)


def train_adapter(args: types.SimpleNamespace, config: dict, model: nn.Module,
                  datasets: tuple[Any, Any], callback: Any, emit: Emit,
                  loss: Callable | None = None, batches: Callable | None = None) -> None:
    """Adapt ``model`` and train it; the adapter lands in ``args.adapter_path``."""
    from mlx_lm.tuner.trainer import TrainingArgs, train
    from mlx_lm.utils import save_config

    adapt(model, args)
    out = Path(args.adapter_path)
    out.mkdir(parents=True, exist_ok=True)
    save_config(vars(args), out / "adapter_config.json")
    training = TrainingArgs(
        batch_size=args.batch_size, iters=args.iters, val_batches=args.val_batches,
        steps_per_report=args.steps_per_report, steps_per_eval=args.steps_per_eval,
        steps_per_save=args.save_every, adapter_file=str(out / "adapters.safetensors"),
        max_seq_length=args.max_seq_length, grad_checkpoint=args.grad_checkpoint,
        grad_accumulation_steps=args.grad_accumulation_steps)
    # AdamW: decoupled decay (weight_decay 0 is Adam's update exactly)
    optimizer = clipped(optim.AdamW, float(config["grad_clip_norm"]))(
        learning_rate=learning_rate(config), weight_decay=float(config.get("weight_decay", 0.0)))
    extra: dict[str, Any] = {}
    if loss is not None:
        extra["loss"] = loss
    if batches is not None:
        extra["iterate_batches"] = batches
    with open(out / "metrics.jsonl", "a", encoding="utf-8") as metrics:
        def record(event: dict) -> None:
            metrics.write(json.dumps(event) + "\n")
            metrics.flush()
            emit(event)

        callback.emit = record
        train(model=model, optimizer=optimizer, train_dataset=datasets[0],
              val_dataset=datasets[1], args=training, training_callback=callback, **extra)
