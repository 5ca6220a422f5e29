"""The preference objectives, written in MLX: DPO and ORPO over chosen/rejected pairs.

A batch holds ``2B`` sequences, the ``B`` chosen completions first and then their ``B``
rejected ones, with ``lengths[i] = (prompt_tokens, total_tokens)`` as mlx-lm's own batches
carry them; the response of row ``i`` is tokens ``prompt_tokens .. total_tokens-1``.

- DPO (Rafailov et al. 2023, "Direct Preference Optimization", eq. 7):
  ``L = -log σ(β·((log π(y_w|x) - log π(y_l|x)) - (log π_ref(y_w|x) - log π_ref(y_l|x))))``
  with sequence log-probs summed over the response tokens. The reference is the frozen
  base: the same model with every LoRA delta switched off (scale 0), so no second copy
  of the weights is held.
- ORPO (Hong et al. 2024, "ORPO: Monolithic Preference Optimization without Reference
  Model", eqs. 6-7): ``L = L_NLL(y_w) + λ·(-log σ(log odds(y_w|x) - log odds(y_l|x)))``
  with ``odds(y|x) = P/(1-P)`` and ``log P`` the length-normalised (token-mean) response
  log-prob. ``sft_scope="full"`` takes ``L_NLL`` as the token-mean cross-entropy over the
  chosen prompt and response (the paper's and TRL's), ``"response"`` as ``-log P(y_w|x)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn

LossFn = Callable[[nn.Module, mx.array, mx.array], tuple[mx.array, mx.array]]


def token_logprobs(model: nn.Module, batch: mx.array,
                   lengths: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """Per-token ``log p(token | prefix)`` for tokens 1.. of each row, with the masks of
    the response tokens and of all real (non-pad) tokens."""
    inputs, targets = batch[:, :-1], batch[:, 1:]
    logits = model(inputs).astype(mx.float32)
    logp = -nn.losses.cross_entropy(logits, targets)
    position = mx.arange(1, targets.shape[1] + 1)[None, :]
    real = position < lengths[:, 1:2]
    response = mx.logical_and(position >= lengths[:, 0:1], real)
    return logp, response, real


def masked_sum(values: mx.array, mask: mx.array) -> mx.array:
    return (values * mask).sum(axis=-1)


def masked_mean(values: mx.array, mask: mx.array) -> mx.array:
    return masked_sum(values, mask) / mx.maximum(mask.sum(axis=-1), 1)


def log1mexp(x: mx.array) -> mx.array:
    """``log(1 - exp(x))`` for ``x < 0``, stable at both ends (Mächler 2012)."""
    x = mx.minimum(x, -1e-7)  # a mean log-prob of exactly 0 would make the odds infinite
    return mx.where(x > -0.6931472, mx.log(-mx.expm1(x)), mx.log1p(-mx.exp(x)))


def dpo_loss(policy_chosen: mx.array, policy_rejected: mx.array, ref_chosen: mx.array,
             ref_rejected: mx.array, beta: float) -> mx.array:
    """Batch mean of DPO's loss from summed response log-probs."""
    margin = (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected)
    return -nn.log_sigmoid(beta * margin).mean()


def orpo_loss(nll_chosen: mx.array, mean_chosen: mx.array, mean_rejected: mx.array,
              lam: float) -> mx.array:
    """Batch mean of ORPO's loss from the chosen NLL and token-mean response log-probs."""
    log_odds = (mean_chosen - mean_rejected) - (log1mexp(mean_chosen) - log1mexp(mean_rejected))
    return (nll_chosen - lam * nn.log_sigmoid(log_odds)).mean()


@contextmanager
def lora_disabled(model: nn.Module) -> Iterator[None]:
    """The base model for the span: every LoRA layer's scale is 0 (its delta drops out)."""
    saved = [(m, m.scale) for m in model.modules() if "lora_a" in m and hasattr(m, "scale")]
    try:
        for m, _ in saved:
            m.scale = 0.0
        yield
    finally:
        for m, scale in saved:
            m.scale = scale


def dpo(beta: float) -> LossFn:
    """A loss for mlx-lm's ``train``: ``(model, batch, lengths) -> (loss, tokens)``."""
    def loss(model: nn.Module, batch: mx.array, lengths: mx.array) -> tuple[mx.array, mx.array]:
        logp, response, _ = token_logprobs(model, batch, lengths)
        policy = masked_sum(logp, response)
        with lora_disabled(model):
            ref_logp, _, _ = token_logprobs(model, batch, lengths)
        ref = mx.stop_gradient(masked_sum(ref_logp, response))
        b = batch.shape[0] // 2
        return dpo_loss(policy[:b], policy[b:], ref[:b], ref[b:], beta), response.sum()
    return loss


def orpo(lam: float, sft_scope: str = "full") -> LossFn:
    """ORPO's loss for mlx-lm's ``train`` (one forward over chosen and rejected rows)."""
    def loss(model: nn.Module, batch: mx.array, lengths: mx.array) -> tuple[mx.array, mx.array]:
        logp, response, real = token_logprobs(model, batch, lengths)
        mean = masked_mean(logp, response)
        b = batch.shape[0] // 2
        nll = -(masked_mean(logp[:b], real[:b]) if sft_scope == "full" else mean[:b])
        return orpo_loss(nll, mean[:b], mean[b:], lam), response.sum()
    return loss


def for_config(config: dict) -> LossFn:
    """The loss of a job's ``method`` with its knobs."""
    if config["method"] == "dpo":
        return dpo(float(config["dpo_beta"]))
    return orpo(float(config["orpo_lambda"]), config["sft_scope"])
