"""Which decode forward a batch runs (``engine/batch/tune.py``): timed once where the
device is a GPU, the fastest kept unless lean is within the margin; lean untimed on the
CPU; ``MLXBUN_DECODE_STEP`` outright. Every way gives mlx-lm's greedy tokens, the timing's
scratch rows leave no block behind, and the fused way makes one matmul fewer a layer."""

from __future__ import annotations

import pytest
from mlx_lm import load

from mlxbun_core import runconfig
from mlxbun_core.engine.batch import Batch, attention, direct, lean, tune
from mlxbun_core.engine.core import Engine
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close, greedy, run_all, token_ids
from mlxbun_core.testing.graph import primitives
from test_engine_batch import N, batch_of, drive, prompts, reference


@pytest.fixture
def qwen3(monkeypatch):
    """A float32 qwen3 (normed heads, untied MLP) on direct attention in plain ops."""
    monkeypatch.setattr(attention, "MODE", "reference")
    return load(str(tiny_checkpoint("qwen3", seed=3, dtype="float32")))[0]


def probed(model) -> Batch:
    b = batch_of(model)
    direct.probe(b)
    assert lean.probe(b) and isinstance(b.lean, lean.LeanDecode)
    return b


def never(*_):
    raise AssertionError("timed where nothing was to be timed")


def test_the_timing_runs_each_way_on_scratch_rows_and_gives_them_back(qwen3, monkeypatch):
    b = probed(qwen3)
    made = b.lean
    seen: list[str] = []
    real_lean, real_model = lean.LeanDecode.__call__, Batch._model_forward

    def lean_call(self, inputs, caches):
        seen.append("fused" if self.fused else "lean")
        return real_lean(self, inputs, caches)

    def model_call(self, inputs, caches):
        if inputs.shape[1] == 1:  # (prefill passes are the model's too)
            seen.append("model")
        return real_model(self, inputs, caches)
    monkeypatch.setattr(lean.LeanDecode, "__call__", lean_call)
    monkeypatch.setattr(Batch, "_model_forward", model_call)
    assert tune.fusable(b, made)  # joined, and the fused step gives the model's logits
    seen.clear()
    ms = tune.time_ways(b, ["lean", "model", "fused"], rows=3)
    assert set(ms) == {"lean", "model", "fused"} and all(v > 0 for v in ms.values())
    per_way = tune.ROUNDS * (tune.STEPS + 1)
    assert {w: seen.count(w) for w in ms} == {w: per_way for w in ms}
    step = tune.STEPS + 1  # each way's steps a round, in a row
    assert seen[::step][:6] == ["lean", "model", "fused", "model", "fused", "lean"]
    assert seen[:3 * step] == ["lean"] * step + ["model"] * step + ["fused"] * step
    assert b.lean is made and not made.fused and b.pool.used == 0 and not b.rows


@pytest.mark.parametrize("ms, way", [
    ({"lean": 10.0, "model": 12.0, "fused": 9.0}, "fused"),
    ({"lean": 10.0, "model": 8.0, "fused": 9.5}, "model"),
    ({"lean": 10.0, "model": 9.8, "fused": 9.9}, "lean"),  # within the margin: lean
])
def test_the_fastest_way_is_kept_unless_lean_is_close(qwen3, ms, way):
    b = probed(qwen3)
    made = b.lean
    verdict = tune.choose(b, rows=2, setting="auto", gpu=True,
                          timing=lambda batch, ways, rows: {w: ms[w] for w in ways})
    assert verdict is not None and (verdict.way, verdict.why) == (way, "timed")
    assert verdict.ms == ms
    assert b.lean is (None if way == "model" else made)
    assert made.fused == (way == "fused")


def test_on_the_cpu_lean_is_kept_untimed_and_a_setting_is_obeyed(qwen3):
    b = probed(qwen3)
    made = b.lean
    assert tune.choose(b, setting="auto", gpu=False, timing=never) == tune.Verdict("lean", "cpu")
    assert b.lean is made and not made.fused
    verdict = tune.choose(b, setting="fused", gpu=True, timing=never)
    assert verdict == tune.Verdict("fused", "set") and b.lean is made and made.fused
    assert tune.choose(b, setting="model", gpu=True, timing=never) == tune.Verdict("model", "set")
    assert b.lean is None
    assert tune.choose(b, setting="lean", timing=never) is None  # no lean step left to set


def test_a_fused_step_that_gives_other_logits_is_not_offered(qwen3, monkeypatch):
    real = lean.LeanDecode._mlp
    monkeypatch.setattr(lean.LeanDecode, "_mlp", lambda self, mlp, x: (
        -1 if self.fused else 1) * real(self, mlp, x))  # (a planted sign flip)
    b = probed(qwen3)
    offered: list[str] = []
    verdict = tune.choose(b, rows=2, setting="auto", gpu=True, timing=lambda batch, ways, rows:
                          offered.extend(ways) or {w: 1.0 for w in ways})
    assert offered == ["lean", "model"] and verdict == tune.Verdict(
        "lean", "timed", {"lean": 1.0, "model": 1.0})
    assert isinstance(b.lean, lean.LeanDecode) and not b.lean.fused
    b = probed(qwen3)  # set outright, it is checked all the same
    assert tune.choose(b, setting="fused", timing=never) == tune.Verdict("lean", "set")
    assert isinstance(b.lean, lean.LeanDecode) and not b.lean.fused


def test_a_fused_step_makes_one_matmul_fewer_a_layer(qwen3):
    counts = []
    for fused in (False, True):
        b = probed(qwen3)
        tune.apply(b, "fused" if fused else "lean", b.lean)
        b.add(0, prompts()[0], budget=4)
        while b.prefilling:
            b.prefill({u: 64 for u in b.prefilling})
        b.decode()
        rows = [b.rows[u] for u in b.decoding]
        assert b.next_tokens is not None
        logits, _ = b.run_pass(b.next_tokens[:, None], rows, [1] * len(rows), b.states.caches)
        counts.append(primitives(logits).get("Matmul", 0))
        b.close()
    assert counts[0] - counts[1] == len(qwen3.model.layers)


@pytest.mark.parametrize("way", ["fused", "model"])
def test_each_way_decodes_mlx_lms_tokens(qwen3, way):
    b = probed(qwen3)
    tune.apply(b, way, b.lean)
    ps = prompts()
    got = drive(b, ps)
    assert [got[i][:N] for i in range(len(ps))] == [reference(qwen3, p) for p in ps]
    assert b.pool.used == 0


@pytest.mark.parametrize("way", ["fused", "model"])
def test_a_served_setting_holds_for_every_batch_and_says_so_in_the_warm_up(way, monkeypatch):
    """``MLXBUN_DECODE_STEP`` through the run configuration: the warm-up's verdict, the
    batches after it (the warm-up's own is dropped) keep the way, and the rows decode
    mlx-lm's tokens (a serial engine's, which runs mlx-lm's loop)."""
    path = str(tiny_checkpoint("qwen3", seed=3, dtype="float32"))
    with runconfig.overridden(engine={"decode_step": way}):
        batched = Engine.load(path, progress=False, batch=4, prompt_cache_bytes=0)
    serial = Engine.load(path, progress=False, batch=1, prompt_cache_bytes=0)
    calls: list[tuple[int, bool]] = []
    real = lean.LeanDecode.__call__
    monkeypatch.setattr(lean.LeanDecode, "__call__", lambda self, *a: calls.append(
        (id(self), self.fused)) or real(self, *a))
    try:
        assert batched.warmup["decode_step"] == {"way": way, "why": "set", "ms": {}}
        bodies = [greedy(p, 12) for p in ("The quick brown fox", "a b c d", "Once upon")]
        got = run_all(batched, bodies, together=True)
        want = [token_ids(r) for r in run_all(serial, bodies)]
        assert [token_ids(r) for r in got] == want
        made = batched.worker.lanes[0]._lean  # the batches' lean step (the lone stream
        assert made is not None  # has its own)
        batch_calls = [fused for who, fused in calls if who == id(made)]
        assert batch_calls == ([True] * len(batch_calls) if way == "fused" else [])
        assert len(batch_calls) >= (10 if way == "fused" else 0)
    finally:
        close(batched, serial)


def test_a_lone_streams_way_is_timed_against_the_models_call(qwen3, monkeypatch):
    calls: list[int] = []
    real = lean.LeanDecode.__call__
    monkeypatch.setattr(lean.LeanDecode, "__call__",
                        lambda self, *a: calls.append(1) or real(self, *a))
    ms = tune.time_solo(qwen3, lean.LeanDecode(qwen3))
    assert set(ms) == {"lean", "model"} and all(v > 0 for v in ms.values())
    assert len(calls) == tune.ROUNDS * (2 * tune.STEPS + 1)
    for timed, way in (({"lean": 5.0, "model": 4.0}, "model"),
                       ({"lean": 5.0, "model": 4.9}, "lean")):
        made, verdict = tune.for_solo(qwen3, setting="auto", gpu=True,
                                      timing=lambda model, step, ms=timed: ms)
        assert verdict == tune.Verdict(way, "timed", timed)
        assert (made is None) == (way == "model")
    made, verdict = tune.for_solo(qwen3, setting="auto", gpu=False, timing=never)
    assert isinstance(made, lean.LeanDecode) and verdict == tune.Verdict("lean", "cpu")
    assert tune.for_solo(qwen3, setting="model", timing=never) == (
        None, tune.Verdict("model", "set"))
    made, verdict = tune.for_solo(qwen3, setting="fused", timing=never)
    assert made is not None and not made.fused and verdict == tune.Verdict("lean", "set")


def test_a_wrong_setting_is_refused_by_name():
    with pytest.raises(ValueError, match="MLXBUN_DECODE_STEP"):
        runconfig.from_environ({"MLXBUN_DECODE_STEP": "fastest"})
    assert runconfig.from_environ({"MLXBUN_DECODE_STEP": " Fused "}).engine.decode_step \
        == "fused"
