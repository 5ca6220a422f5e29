"""The MTP head reads the prompt on the batch lane: mlx-lm's batched prefill hands the
target's hidden states of its MTP rows to their heads.

mlx-lm's ``BatchGenerator`` reads prompts in ``PromptProcessingBatch.prompt`` (a chunk of
every prompt row per call, right-padded) and feeds each row's last prompt token in the
first step of the generation batch it splits off (``split(...).generate``). While either
carries an MTP row, the prompt batch's model is the predictor's forward (same logits,
plus the hidden states), and afterwards each MTP row's states go to its head: a chunk's
states paired with the prompt tokens after them; the last token's state waits for the
token sampled after it (the row's first pending token, see ``mtp_batch``). Rows without
a head, and turns without an MTP row, run the model as always.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import mlx.core as mx

    from .mtp_batch import MtpBatch


class _Tap:
    """The prompt batch's model: the plain model, or while ``on`` the predictor's
    forward, keeping each call's hidden states."""

    def __init__(self, model: Any, mtp: MtpBatch):
        self.model, self.mtp = model, mtp
        self.on = False
        self.hidden: list[mx.array] = []

    def __call__(self, inputs: mx.array, cache: Any = None, **kw: Any) -> mx.array:
        if not self.on or kw:
            out: mx.array = self.model(inputs, cache=cache, **kw)
            return out
        logits, hidden = self.mtp.predictor.forward(inputs, cache)
        self.hidden.append(hidden)
        return logits

    def __getattr__(self, name: str) -> Any:  # the model's own attributes (layers, args)
        return getattr(self.model, name)

    def run(self, call: Any, *args: Any) -> tuple[Any, mx.array | None]:
        """``call(*args)`` with the forward tapped; its result and the states of every
        pass it made, along the sequence axis (None: it made none)."""
        import mlx.core as mx

        self.on, self.hidden = True, []
        try:
            out = call(*args)
        finally:
            self.on = False
        hidden, self.hidden = self.hidden, []
        return out, (mx.concatenate(hidden, axis=1) if hidden else None)


def install(gen: Any, mtp: MtpBatch) -> None:
    """Give ``gen``'s prompt batch (it lives as long as the generator) the tap."""
    batch = gen._prompt_batch
    tap = _Tap(batch.model, mtp)
    batch.model = tap
    prompt, split = batch.prompt, batch.split

    def tapped_prompt(tokens: list[list[int]]) -> Any:
        uids = list(batch.uids)
        want = [i for i, uid in enumerate(uids) if uid in mtp.rows]
        if not want or not tokens:
            return prompt(tokens)
        out, hidden = tap.run(prompt, tokens)
        if hidden is not None:
            mtp.read({uids[i]: hidden[i:i + 1, :len(tokens[i])] for i in want})
        return out

    def tapped_split(indices: list[int]) -> Any:
        part = split(indices)
        generate = part.generate

        def tapped_generate(tokens: list[list[int]]) -> Any:
            uids = list(part.uids)
            want = [i for i, uid in enumerate(uids) if uid in mtp.rows]
            if not want:
                return generate(tokens)
            out, hidden = tap.run(generate, tokens)
            if hidden is not None:
                mtp.last_prompt_states({uids[i]: hidden[i:i + 1, -1:] for i in want})
            return out

        part.generate = tapped_generate
        return part

    batch.prompt, batch.split = tapped_prompt, tapped_split
