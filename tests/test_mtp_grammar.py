"""MTP speculation under a grammar: the head's guesses walk the request's matcher (each
sampled under the grammar's mask at its position; a refused one ends the draft), the
verify pass masks each draft's position as plain constrained decoding does, rejected
drafts leave the cache and the matcher; with fill on, forced runs and head drafts share
windows. Greedy replies equal plain constrained decoding (the same engine,
``draft_kind: none``) for a 10-field schema, a regex, free words and a forced tool call,
in fewer forward passes (rows sharing batch steps: ``test_mtp_batch_grammar.py``).

The tiny Qwen3.5 checkpoint's head is the ``"copy"`` head (see
:mod:`mlxbun_core.testing.mtp`); its target has recurrent (gated-DeltaNet) layers, so
rejected drafts are taken back by the snapshot-and-refeed path.
"""

from __future__ import annotations

import json

import pytest

from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.reply import Reply
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from tests.test_fill import FIELDS, run
from tests.test_spec_grammar import BODIES, drafted, same, with_draft

NAMES = ["json10", "regex", "words", "tool"]


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("qwen3_5", mtp="copy", dtype="float32")


@pytest.fixture(scope="module")
def serial(ckpt):
    eng = Engine.load(str(ckpt), progress=False, batch=1, prompt_cache_bytes=0,
                      fill="strict")
    yield eng
    eng.worker.close()


class Forwards:
    """Counts the target's forward passes: its text model's, which plain decoding (through
    the outer model) and the MTP stream (``predictor.forward``) both call."""

    def __init__(self, eng: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        cls = type(eng.model.model.language_model.model)
        original = cls.__call__

        def counted(inner, *args, **kwargs):
            self.calls += 1
            return original(inner, *args, **kwargs)
        monkeypatch.setattr(cls, "__call__", counted)

    def run(self, eng: Engine, body: dict, kind: str, fill: str) -> tuple[Reply, int]:
        before = self.calls
        (reply,) = run(eng, [with_draft(body, kind)], fill)
        return reply, self.calls - before


def check_shape(name: str, reply: Reply) -> None:
    if name == "json10":
        assert set(json.loads(reply.content)) == set(FIELDS)
    if name == "tool":
        assert reply.tool_calls and reply.tool_calls[0].name == "get_weather"


@pytest.mark.parametrize("name", NAMES)
def test_mtp_under_grammar_equals_plain(serial, name, monkeypatch):
    """Drafts alone (fill off): the reply is plain constrained decoding's, drafts were
    sent and some accepted, in fewer target forwards than plain."""
    body, count = BODIES[name], Forwards(serial, monkeypatch)
    plain, n_plain = count.run(serial, body, "none", "off")
    fast, n_fast = count.run(serial, body, "mtp", "off")
    assert plain.finish.usage.speculation is None
    same(plain, fast)
    check_shape(name, fast)
    spec = drafted(fast)
    assert spec["drafted"] > 0
    assert fast.finish.usage.lane == "serial+spec"
    if name == "words":  # random words the head does not guess: drafts stop riding
        assert n_fast <= n_plain + 1, (n_plain, n_fast)  # (an EOS sampled at the end)
        return
    # the copy head guesses the grammar's punctuation and keys (masked, it proposes
    # the one token a position allows)
    assert spec["accepted"] > 0
    assert spec["targetCalls"] < fast.finish.usage.completion_tokens
    assert n_fast < n_plain, (n_plain, n_fast)


@pytest.mark.parametrize("name", NAMES)
def test_mtp_and_fill_together_equal_plain(serial, name, monkeypatch):
    """Fill on and MTP drafts asked for: forced runs and head drafts ride the same
    windows; the reply is plain constrained decoding's, in no more forwards than fill
    alone and fewer than plain."""
    body, count = BODIES[name], Forwards(serial, monkeypatch)
    plain, n_plain = count.run(serial, body, "none", "off")
    fill, n_fill = count.run(serial, body, "none", "strict")
    both, n_both = count.run(serial, body, "mtp", "strict")
    same(plain, fill)
    same(plain, both)
    check_shape(name, both)
    drafted(both)  # the request ran the MTP stream
    assert both.finish.usage.fill_report()["injected"] > 0
    assert n_both <= n_fill and n_both < n_plain, (n_plain, n_fill, n_both)
