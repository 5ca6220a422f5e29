"""The batch lane's passes are warmed at start, before ``/health`` says ready: a prefill
chunk and decode steps at two scratch rows, whose blocks go back to the pool (then the
pool itself goes: an idle server holds no KV). The time is in ``/stats`` and the banner;
where there is no batch lane nothing is warmed, and the warm-up leaves nothing behind
that changes a reply."""

from __future__ import annotations

import argparse

import httpx
import pytest

from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.lanes.batch import BatchLane
from mlxbun_core.startup import print_banner
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close, greedy, lane_replies, token_ids
from mlxbun_core.testing.server import running_server

PROMPTS = ["The quick brown fox", "Once upon a time in a land far away"]


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("llama", seed=11)


def test_the_batch_is_warmed_at_start_and_its_pool_is_empty_again(ckpt):
    engine = Engine.load(str(ckpt), progress=False, batch=4, prompt_cache_bytes=0)
    try:
        done = engine.warmup
        assert done["batch_passes"] == 3  # one prefill pass at two rows, two decode steps
        assert done["batch_s"] > 0 and done["prefill_s"] > 0
        assert done["batch_blocks_held"] >= 2, "the scratch rows' KV went into blocks"
        assert done["batch_blocks_left"] == 0, "every block went back to the pool"
        # the decode step's way: lean (the tiny llama is mirrored), untimed on the CPU
        assert done["decode_step"] == {"way": "lean", "why": "cpu", "ms": {}}
        assert done["solo_step"] == {"way": "lean", "why": "cpu", "ms": {}}
        # an idle server holds no KV blocks: the pool is made again by the first row
        assert engine.batch_stats()["kv_blocks"] is None
        assert engine.batch_stats()["warmup"] == done
    finally:
        close(engine)


def test_the_warm_up_takes_the_last_rows_way_out_of_the_batch(ckpt, monkeypatch):
    """The lone path a batch's last row goes on by (its partner removed, the row exported
    to a single-sequence cache and decoded by the model's own call) runs at start too:
    its first use compiled a kernel on CUDA that a real request paid seconds for."""
    from mlxbun_core.engine.batch import Batch

    calls: list[tuple[str, int, int]] = []
    real_export, real_remove = Batch.export, Batch.remove

    def export(self, uid):
        calls.append(("export", uid, len(self.rows)))
        return real_export(self, uid)

    def remove(self, uid):
        calls.append(("remove", uid, len(self.rows)))
        return real_remove(self, uid)
    monkeypatch.setattr(Batch, "export", export)
    monkeypatch.setattr(Batch, "remove", remove)
    engine = Engine.load(str(ckpt), progress=False, batch=4, prompt_cache_bytes=0)
    try:
        # the partner leaves a two-row batch (the rows' sampled tokens are gathered), then
        # the last row is exported and decoded alone, then it goes too
        # (the warm-up's scratch rows count down from -1; the probes' own scratch batch
        # holds rows 0 and 1)
        warm_calls = [c for c in calls if c[1] < 0]
        assert warm_calls[:3] == [("remove", -2, 2), ("export", -1, 1), ("remove", -1, 1)]
        assert engine.warmup["batch_blocks_left"] == 0
    finally:
        close(engine)


def test_a_server_without_a_batch_lane_warms_no_batch(ckpt):
    engine = Engine.load(str(ckpt), progress=False, batch=1)
    try:
        assert engine.warmup["batch_passes"] == 0 and engine.warmup["batch_s"] is None
        assert engine.warmup["batch_blocks_held"] is None
    finally:
        close(engine)


def test_the_warm_up_changes_no_reply(ckpt, monkeypatch):
    """Two rows batched from their first step decode the same tokens whether the batch
    was warmed or not (no scratch token, block or sampled state is left over)."""
    bodies = [greedy(p, 10) for p in PROMPTS]

    def replies():
        engine = Engine.load(str(ckpt), progress=False, batch=4, prompt_cache_bytes=0)
        try:
            got = lane_replies(engine, bodies, [0, 0])
            assert {r.finish.usage.lane for r in got} == {"batched"}
            return [token_ids(r) for r in got], engine.warmup["batch_passes"]
        finally:
            close(engine)

    warmed, passes = replies()
    monkeypatch.setattr(BatchLane, "warm", lambda self: {})
    cold, none = replies()
    assert passes == 3 and none == 0
    assert warmed == cold


def test_stats_and_the_banner_report_the_warm_up(ckpt, capsys):
    with running_server(ckpt, max_tokens=8, batch=4) as srv:
        stats = httpx.get(f"http://127.0.0.1:{srv.port}/stats").json()
        warm = stats["batch"]["warmup"]
        assert warm["batch_passes"] == 3 and warm["batch_s"] > 0
        assert warm["batch_blocks_left"] == 0
        args = argparse.Namespace(unix=None, host="127.0.0.1", port=srv.port)
        print_banner(args, srv.engine)
    line = next(x for x in capsys.readouterr().out.splitlines() if "warm-up" in x)
    assert "batch passes at 2 rows" in line and f"{warm['batch_s']:.2f} s" in line
    assert warm["decode_step"]["way"] == "lean" and "decode steps lean" in line
