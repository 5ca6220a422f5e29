"""A "scripted model" for surface tests: fakes the WEIGHTS, not the engine.

Random tiny checkpoints emit gibberish, so tests that need exact model output
(tool calls, thinking, stop sequences) register :class:`ScriptedPlugin`. It
claims its own tiny checkpoint, loads it with mlx-lm as usual and wraps the
module so that, after the assistant generation prompt, its logits put all mass
on the next token of ``plugin.text`` (then EOS). Everything else — chat
template, sampler, detokenizer, reasoning splitter, tool parser, surfaces —
is the real path.

    with scripted_server('<tool_call>{"name": "f", "arguments": {}}</tool_call>') as (srv, plugin):
        ...  # set plugin.text = "..." between requests to change the script
        plugin.prompts[-1]  # the last prompt the model was shown, as text
        plugin.reply = lambda prompt: "..."  # or pick the script from each prompt
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlxbun_core import plugins
from mlxbun_core.family import load_mlx_lm
from mlxbun_core.hookspecs import hookimpl
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server

# ChatML generation prompt; the script starts right after its last occurrence.
CHATML_ANCHOR = "<|im_start|>assistant\n"


class ScriptedModel(nn.Module):
    """Runs the real (random) forward to keep the KV cache honest, then replaces
    the logits. Position in the script = tokens seen since the last anchor,
    tracked per cache object (truncated to the cache offset, so reuse/rollback
    of a prompt cache stays correct)."""

    def __init__(self, inner, tokenizer, plugin: ScriptedPlugin):
        super().__init__()
        self.inner = inner
        # plain attributes, not module children (nn.Module would treat lists/dicts as params)
        object.__setattr__(self, "_tok", tokenizer)
        object.__setattr__(self, "_plugin", plugin)
        anchor = tokenizer.encode(plugin.anchor, add_special_tokens=False)
        object.__setattr__(self, "_anchor", anchor)
        object.__setattr__(self, "_scripts", {})

    @property
    def layers(self):
        return self.inner.layers

    def make_cache(self):
        if hasattr(self.inner, "make_cache"):
            return self.inner.make_cache()
        from mlx_lm.models.cache import KVCache
        return [KVCache() for _ in self.inner.layers]

    def _script(self) -> list:
        text = self._plugin.text
        if text not in self._scripts:
            eos = self._plugin.eos_id if self._plugin.eos_id is not None else \
                sorted(self._tok.eos_token_ids)[0]
            self._scripts[text] = self._tok.encode(text, add_special_tokens=False) + [eos]
        return self._scripts[text]

    def _position(self, history: list) -> int | None:
        n = len(self._anchor)
        for i in range(len(history) - n, -1, -1):
            if history[i:i + n] == self._anchor:
                return len(history) - (i + n)
        return None

    def __call__(self, inputs, cache=None, **kw):
        head = cache[0] if cache else None
        before = getattr(head, "offset", 0) if head is not None else 0
        logits = self.inner(inputs, cache=cache, **kw)
        history = (getattr(head, "_scripted_history", []) if head is not None else [])[:before]
        history = history + inputs.reshape(-1).tolist()
        if head is not None:
            head._scripted_history = history
        pos = self._position(history)
        if pos is None:
            return logits
        if pos == 0:  # this forward ended the prompt: keep what the model was shown
            self._plugin.prompts.append(self._tok.decode(history))
            if self._plugin.reply is not None:  # the script answers this prompt
                self._plugin.text = self._plugin.reply(self._plugin.prompts[-1])
        if self._plugin.fail_at is not None and pos >= self._plugin.fail_at:
            raise RuntimeError("scripted forward failure")
        script = self._script()
        if self._plugin.free_after and pos >= len(script) - 1:
            return logits  # the script was a prefix: the model's own logits from here
        token = script[min(pos, len(script) - 1)]
        vocab = logits.shape[-1]
        forced = mx.where(mx.arange(vocab) == token, 0.0, -1e9).astype(mx.float32)
        return mx.broadcast_to(forced, logits.shape)


class BatchedScriptedModel(ScriptedModel):
    """A ScriptedModel for the batch lane, where one forward carries several rows that
    join, leave and move between the block pool and single-sequence caches. Each row's
    token history rides along as one more cache layer (a "tape": the ids stored as
    keys), so every path the engine moves KV on (the pool's blocks, prefix cache shares
    and copies, the solo hand-offs) moves the history with it. A row's script is the
    plugin's ``reply`` (or ``text``) for the prompt it ended with: looked up per row,
    never shared.

    Only a one-token pass is scripted: the engine samples from those alone (a prompt's
    last token is fed by the first decode step, on the batch and alone), while the
    prefill passes before it may pad rows to a common width."""

    def make_cache(self):
        from mlx_lm.models.cache import KVCache

        return [*super().make_cache(), KVCache()]

    @staticmethod
    def _histories(inputs, tape) -> list[np.ndarray]:
        """Every row's tokens so far, this pass's included (a pool layer's ``offset``
        is per row, a plain cache's one number)."""
        ids = inputs.astype(mx.float32)[:, None, :, None]
        starts = np.broadcast_to(np.array(tape.offset), (inputs.shape[0],)).tolist()
        keys, _ = tape.update_and_fetch(ids, ids)
        rows = np.array(keys[:, 0, :, 0].astype(mx.int32))
        width = inputs.shape[1]
        return [rows[b, :starts[b] + width] for b in range(rows.shape[0])]

    def _row_script(self, history: np.ndarray, pos: int) -> list:
        """The script of the row whose prompt is ``history[:len - pos]``."""
        prompt = history[:history.size - pos]
        key = hash(prompt.tobytes())
        if key not in self._scripts:
            text = self._tok.decode(prompt.tolist())
            if pos == 0:
                self._plugin.prompts.append(text)
            reply = self._plugin.reply(text) if self._plugin.reply else self._plugin.text
            eos = sorted(self._tok.eos_token_ids)[0]
            self._scripts[key] = self._tok.encode(reply, add_special_tokens=False) + [eos]
        return self._scripts[key]

    def _last_anchor(self, history: np.ndarray) -> int | None:
        """Tokens since the end of the row's last generation prompt (None: none yet)."""
        n, anchor = len(self._anchor), np.array(self._anchor)
        if history.size < n:
            return None
        for i in reversed(np.flatnonzero(history[:history.size - n + 1] == anchor[0])):
            if np.array_equal(history[i:i + n], anchor):
                return int(history.size - (i + n))
        return None

    def __call__(self, inputs, cache=None, **kw):
        if cache is None:
            return self.inner(inputs, **kw)
        logits = self.inner(inputs, cache=cache[:-1], **kw)
        histories = self._histories(inputs, cache[-1])
        if inputs.shape[1] != 1:
            return logits
        vocab, forced = logits.shape[-1], []
        for b, history in enumerate(histories):
            pos = self._last_anchor(history)
            if pos is None:
                forced.append(logits[b])
                continue
            script = self._row_script(history, pos)
            token = script[min(pos, len(script) - 1)]
            row = mx.where(mx.arange(vocab) == token, 0.0, -1e9).astype(logits.dtype)
            forced.append(mx.broadcast_to(row, logits.shape[1:]))
        return mx.stack(forced)


class ScriptedPlugin:
    """Claims exactly one checkpoint directory and serves it as a ScriptedModel
    (``batched``: a BatchedScriptedModel, for a server with several rows)."""

    def __init__(self, path, text: str = "", *, anchor: str = CHATML_ANCHOR, eos_id=None,
                 batched: bool = False):
        self.path = Path(path).resolve()
        self.text, self.anchor, self.eos_id = text, anchor, eos_id
        self.batched = batched
        self.fail_at = None  # set to N: the forward raises from script position N on
        self.prompts: list[str] = []  # every prompt the model ran, decoded (specials kept)
        self.free_after = False  # True: after the script, the random model (not EOS) goes on
        self.reply = None  # set to f(prompt text) -> script: a script chosen per request

    @property
    def FAMILY(self) -> str:  # one family per checkpoint, so several can be registered at once
        return f"scripted-{self.path.name}"

    @hookimpl(tryfirst=True)
    def claims(self, path):
        return self.FAMILY if Path(path).resolve() == self.path else None

    @hookimpl
    def load_model(self, path, config, options):
        loaded = load_mlx_lm(path, config, options, reasoning=None)  # as the generic plugin
        kind = BatchedScriptedModel if self.batched else ScriptedModel
        loaded.model = kind(loaded.model, loaded.tokenizer, self)
        return loaded


def scripted_checkpoint_plugin(text: str = "", model_type: str = "qwen3", seed: int = 4242,
                               batched: bool = False, **kw) -> ScriptedPlugin:
    """A plugin bound to its own tiny checkpoint (a seed other tests do not use,
    so the memoized directory is not shared with unscripted tests)."""
    return ScriptedPlugin(tiny_checkpoint(model_type=model_type, seed=seed, **kw), text,
                          batched=batched)


@contextmanager
def scripted_server(text: str = "", *, name: str = "scripted-test", batch: int = 1, **kw):
    """Register a ScriptedPlugin, serve its checkpoint, clean both up after. With
    ``batch`` > 1 the batch lane runs it (a BatchedScriptedModel: a script per row)."""
    plugin = scripted_checkpoint_plugin(text, batched=batch > 1, **kw)
    plugins.register(plugin, name)
    try:
        srv = start_server(plugin.path, batch=batch)
        try:
            yield srv, plugin
        finally:
            srv.stop()
    finally:
        plugins.unregister(name)


def scripted_fixtures(text: str, name: str, **kw):
    """A surface test module's fixtures, bound by ``server, srv, plugin =
    scripted_fixtures(...)``: ``server`` is ``(srv, plugin)`` served once for the module;
    ``srv`` hands out the server with the script reset to ``text`` (no forward failure)
    before each test; ``plugin`` is the ScriptedPlugin, for tests that change the script."""
    @pytest.fixture(scope="module")
    def server():
        with scripted_server(text, name=name, **kw) as pair:
            yield pair

    @pytest.fixture
    def srv(server):
        srv, plugin = server
        plugin.text, plugin.fail_at = text, None
        return srv

    @pytest.fixture
    def plugin(server):
        return server[1]

    return server, srv, plugin
