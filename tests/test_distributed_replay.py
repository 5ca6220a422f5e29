"""A distributed follower replays rank 0's batch from plain data, in one process.

Rank 0's engine runs as under ``--distributed``: its model is the real ``LockstepModel``
and the batch lane writes its journal there. The channel between the ranks is the one
thing stood in for: each descriptor goes through pickle (it must be plain data) to a
real :class:`~mlxbun_core.distributed.follower.Follower` holding a second copy of the
model, which applies the record to block pools and recurrent states of its own and runs
the same forward pass. With the whole model on both sides every pass's logits must be
equal to the bit, and so must the follower's pool; greedy output equals an engine
without any of this. ``tests/test_distributed.py`` runs real ranks over MLX's ring.
"""

from __future__ import annotations

import gc
import pickle

import mlx.core as mx
import pytest

from mlxbun_core import loader
from mlxbun_core.distributed import mirror
from mlxbun_core.distributed.follower import Follower
from mlxbun_core.distributed.lockstep import LockstepModel
from mlxbun_core.engine import batch as batch_package
from mlxbun_core.engine.batch.journal import Journal
from mlxbun_core.engine.batch.pool import BlockPool, BlockTable
from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.worker import ModelWorker
from mlxbun_core.model import LoadOptions
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close, finishes, greedy, run_all, token_ids

PROMPTS = ["hello there", "the quick brown fox jumps over the lazy dog", "one two three",
           "a", "seven eight nine ten eleven twelve", "zebras and lions"]


class Group:
    def size(self) -> int:
        return 2


class LocalChannel:
    """The channel, in one process: what rank 0 sends reaches ``follower`` as pickled
    bytes, and each forward pass's follower logits are kept for the comparison."""

    def __init__(self, follower: Follower):
        self.follower, self.group = follower, Group()
        self.pending: tuple | None = None
        self.outputs: list[mx.array] = []
        self.kinds: list[str] = []  # what each forward pass ran on: "pass" or "caches"
        self._stream = None

    @property
    def stream(self):
        if self._stream is None:
            self._stream = mx.new_stream(mx.default_device())
        return self._stream

    def send(self, desc: tuple) -> None:
        self.pending = pickle.loads(pickle.dumps(desc))

    def share(self, arrays: list) -> list:
        desc, self.pending = self.pending, None
        assert desc is not None
        if desc[0] in ("ping", "stop"):  # every rank adds its one
            if desc[0] == "ping":
                self.follower.apply(desc)
            return [a * 2 for a in arrays]
        self.follower.apply(desc)
        self.kinds.append(desc[3][0])
        self.outputs.append(self.follower.forward(desc, [mx.array(a) for a in arrays]))
        return arrays


class Checked(LockstepModel):
    """Rank 0's lockstep model, comparing each pass's logits with the follower's."""

    def __call__(self, inputs, cache=None, **kwargs):
        out = super().__call__(inputs, cache=cache, **kwargs)
        theirs = self._channel.outputs[-1]
        self.same.append(bool(mx.array_equal(out, theirs)))
        return out


def _pair(family: str, batch: int = 8, **kw):
    """(rank 0's engine, its channel, the follower): a checkpoint loaded twice."""
    worker, model, lockstep, channel, follower = _ranks(family)
    model.model = lockstep
    engine = Engine(model, worker=worker, batch=batch, **kw)
    return engine, channel, follower


def _ranks(family: str):
    """(rank 0's worker, its loaded model, its lockstep model, the channel, the
    follower): a checkpoint loaded twice, the follower's copy behind the channel."""
    path = str(tiny_checkpoint(family, seed=3, dtype="float32"))
    worker = ModelWorker()
    model = worker.run_sync(lambda: loader.load(path, LoadOptions(), progress=False))
    theirs = worker.run_sync(lambda: loader.load(path, LoadOptions(), progress=False)).model
    mirror.install(recording=True, model=theirs)  # rank 0 records, the follower replays
    with mirror.RECORDER.quiet():
        follower = Follower(theirs)
    channel = LocalChannel(follower)
    lockstep = Checked(model.model, channel)
    object.__setattr__(lockstep, "same", [])
    return worker, model, lockstep, channel, follower


@pytest.fixture
def recording():
    yield
    mirror.RECORDER.on = False  # the wrappers stay, quiet, for the rest of the session
    mirror.RECORDER.take()


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_followers_replay_the_batch_pass_for_pass(family, recording, monkeypatch):
    """Concurrent requests batch together (prefill chunks, decode steps, rows joining
    and leaving, the pool growing, the recurrent states of Qwen3.5's linear attention):
    every pass's logits on the follower equal rank 0's, its pool ends equal to rank
    0's, and the tokens equal a plain engine's."""
    monkeypatch.setattr(batch_package, "FIRST_BLOCKS", 2)  # the pool grows as rows come
    engine, channel, follower = _pair(family)
    plain = Engine.load(str(tiny_checkpoint(family, seed=3, dtype="float32")), progress=False,
                        batch=8, prompt_cache_bytes=0)
    bodies = [greedy(p, 10) for p in PROMPTS]
    try:
        start = len(channel.kinds)
        got = run_all(engine, bodies)
        assert [token_ids(r) for r in got] == [token_ids(r) for r in run_all(plain, bodies)]
        assert channel.kinds[start:] and set(channel.kinds[start:]) == {"pass"}
        assert engine.model.model.same and all(engine.model.model.same)
        lane = engine.worker.lanes[0]
        ours = lane._batch.layout
        engine.worker.run_sync(engine.model.model.ping)  # the record so far reaches it
        theirs = follower.replica.layouts[ours.name]
        assert ours.pool.capacity > 2 and theirs.pool.capacity == ours.pool.capacity
        for a, b in zip(ours.all_stores(), theirs.all_stores()):
            assert a.keys is not None and mx.array_equal(a.keys, b.keys)
            assert mx.array_equal(a.values, b.values)
        engine.worker.run_sync(engine.prefix.clear)
        assert lane._batch.pool.used == 0
        gc.collect()
        engine.worker.run_sync(engine.model.model.ping)
        assert not follower.replica.states  # every state rank 0 let go, the follower did
    finally:
        close(engine, plain)


def test_rejected_drafts_roll_the_followers_recurrent_states_back_too(recording):
    """Drafts (some right, some wrong) on Qwen3.5, rows arriving apart: a row that
    rejects one gets its linear-attention state from before the window back (a copy
    taken before it, then a per-row select) and feeds its kept tokens again. The
    follower's states go through the same from the journal, so every pass's logits
    equal rank 0's to the bit, its pool ends equal, the tokens equal mlx-lm's, and every
    state rank 0 let go (the copies too) is gone on the follower."""
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    from mlxbun_core.engine.batch.executor import Batch
    from mlxbun_core.engine.batch.layout import layout

    path = str(tiny_checkpoint("qwen3_5", seed=3, dtype="float32"))
    ours, theirs = load(path)[0], load(path)[0]
    prompts = [[5 + (i * 7 + j * 3) % 200 for j in range(n)]
               for i, n in enumerate([37, 5, 21, 1, 13])]
    ref = [[int(t) for t, _ in generate_step(mx.array(p), ours, max_tokens=12,
                                              sampler=lambda x: mx.argmax(x, axis=-1))]
           for p in prompts]
    with mirror.RECORDER.quiet():
        follower = Follower(theirs)
    channel = LocalChannel(follower)
    lockstep = Checked(ours, channel)
    object.__setattr__(lockstep, "same", [])
    b = Batch(lockstep, layout(lockstep), BlockPool(4, 8, 4096), journal=lockstep.journal)
    got, counts = _drafting(b, prompts, ref)
    assert [got[i][:12] for i in range(len(prompts))] == ref
    assert 0 < counts["accepted"] < counts["drafted"]
    assert counts["mixed"] > 0  # a window where some rows rolled back and others did not
    assert lockstep.same and all(lockstep.same)
    lockstep.ping()  # the record so far reaches the follower
    mine, copy = b.layout, follower.replica.layouts[b.layout.name]
    for x, y in zip(mine.all_stores(), copy.all_stores()):
        assert mx.array_equal(x.keys, y.keys) and mx.array_equal(x.values, y.values)
    assert b.pool.used == 0 and copy.pool.used == 0  # (the follower's tables are rank 0's)
    del b, mine
    gc.collect()
    lockstep.ping()
    assert not follower.replica.states and not follower.replica.layouts


def _drafting(b, prompts: list[list[int]], ref: list[list[int]]):
    """Rows ``prompts`` added a step apart, each decode step drafting up to four of the
    reference's next tokens per row, one of them spoiled 40% of the time; the tokens
    handed out per row and the draft counts."""
    import random

    rng = random.Random(1)
    got: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    counts = {"drafted": 0, "accepted": 0, "mixed": 0}
    added = 0
    while any(len(g) < len(r) for g, r in zip(got.values(), ref)):
        if added < len(prompts):
            b.add(added, prompts[added], budget=len(ref[added]))
            added += 1
        if b.prefilling:
            b.prefill({u: 7 for u in b.prefilling[:3]})
        drafts = {}
        for u in b.decoding:
            if b.pending(u) is not None:
                at = len(got[u]) + 1  # the pending token is ref[u][at - 1]
                d = list(ref[u][at:at + rng.randint(0, 4)])
                if d and rng.random() < 0.4:
                    d[rng.randrange(len(d))] ^= 1
                drafts[u] = d
        out = b.decode(drafts=drafts)
        firsts = [e for e in out if e.drafted]
        if len({e.accepted < e.drafted for e in firsts}) == 2:
            counts["mixed"] += 1
        for e in out:
            got[e.uid].append(e.token)
            counts["drafted"] += e.drafted
            counts["accepted"] += e.accepted
            if e.finish:
                b.remove(e.uid)
    return got, counts


def test_the_leader_engine_takes_draft_kind_ngram(recording):
    """``serve --distributed --draft-kind ngram``: rank 0's engine speculates with prompt
    lookup by default (the flag was dropped before), its passes still replayed."""
    from types import SimpleNamespace

    from mlxbun_core.cli import build_parser
    from mlxbun_core.dist_serve import leader_engine
    from mlxbun_core.startup import lookup_config

    worker, model, lockstep, _, _ = _ranks("llama")
    args = build_parser().parse_args(["serve", "m", "--distributed", "--batch", "8",
                                      "--draft-kind", "ngram", "--num-draft-tokens", "3"])
    leader = leader_engine(args, SimpleNamespace(size=2, mode="tensor"), model, lockstep,
                           worker, lookup_config(args))
    try:
        assert leader.speculation is not None and leader.speculation.kind == "ngram"
        assert leader.speculation.num_draft_tokens == 3
        (reply,) = run_all(leader, [greedy("one two three one two three one two", 8)])
        assert reply.finish.usage.speculation is not None  # the row was a lookup's
        assert lockstep.same and all(lockstep.same)
    finally:
        close(leader)


def test_a_lone_request_stays_a_batch_row_and_cache_kinds_stay_apart(recording):
    """Under a journal a lone request decodes in the batch (no hand-off of its KV to
    mlx-lm caches); its next turn hits the batch's block entry. A seeded request (the
    serial lane, mlx-lm caches mirrored) misses that entry and makes its own, which its
    own next turn hits; the follower keeps up with both kinds."""
    engine, channel, _ = _pair("llama")
    cold = Engine.load(str(tiny_checkpoint("llama", seed=3, dtype="float32")), progress=False,
                       batch=8, prompt_cache_bytes=0)
    text = "The sea and the sky meet at the edge of the world. " * 8
    try:
        start = len(channel.kinds)
        (first,) = run_all(engine, [greedy(text + "Why?", 6)])
        assert set(channel.kinds[start:]) == {"pass"}  # never the lone stream's caches
        (again,) = run_all(engine, [greedy(text + "Why? Where?", 6)])
        assert again.finish.usage.cached_tokens > 100
        start = len(channel.kinds)
        seeded = [greedy(text + "Why? Where?", 6, seed=7), greedy(text + "Why? When?", 6, seed=7)]
        serial = [run_all(engine, [b])[0] for b in seeded]
        assert set(channel.kinds[start:]) == {"caches"}
        assert serial[0].finish.usage.cached_tokens == 0  # the block entry is not its kind
        assert serial[1].finish.usage.cached_tokens > 100  # its own entry, copied and trimmed
        want = run_all(cold, [greedy(text + "Why? Where?", 6)] + seeded)
        assert [token_ids(r) for r in [again, *serial]] == [token_ids(r) for r in want]
        assert all(engine.model.model.same)
        kinds = {ns[1] for ns, _, _ in engine.prefix._entries()}
        assert kinds == {"blocks", "caches"}
    finally:
        close(engine, cold)


def test_a_journaled_layout_refuses_to_move_kv_in_or_out():
    """Loading an mlx-lm cache into blocks, or exporting blocks, would carry this
    rank's KV alone: with a journal both are refused, before anything changes."""
    from mlx_lm.models.cache import KVCache

    from mlxbun_core.engine.batch.layout import PAGED, Layout, Slot

    journal = Journal()
    made = Layout([Slot(PAGED)], BlockPool(4, 8), journal=journal)
    table = BlockTable(made.pool)
    with pytest.raises(RuntimeError, match="cannot be replayed"):
        made.load(table, [KVCache()], 3)
    with pytest.raises(RuntimeError, match="cannot be replayed"):
        made.export(table, [])
    assert made.pool.used == 0
    assert [op[0] for op in journal.take()] == ["layout"]


def test_a_journal_takes_no_kv_scheme_and_no_mtp_tap():
    """Quantized blocks are not replayed, and an MTP tap runs the model's layers outside
    its call: a journaled batch refuses both outright, recording nothing."""
    from mlxbun_core import kvquant
    from mlxbun_core.engine.batch.executor import Batch
    from mlxbun_core.engine.batch.layout import PAGED, Slot

    journal = Journal()
    with pytest.raises(ValueError, match="cannot be replayed"):
        Batch(None, [Slot(PAGED)], BlockPool(4, 8), kv=kvquant.parse("8"), journal=journal)
    with pytest.raises(ValueError, match="cannot be replayed"):
        Batch(None, [Slot(PAGED)], BlockPool(4, 8), tap=object(), journal=journal)
    assert journal.take() == []


# blocks of room: rows run short of blocks mid-decode (tried: llama 180-250, qwen3_5 250-300)
ROOMS = {"llama": 215, "qwen3_5": 275}


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_rows_preempted_for_blocks_keep_the_followers_in_step(family, recording):
    """A device of room for ``ROOMS`` blocks (the reading is what the pool leaves free;
    the pool keeps a step's room beside it): rows that need a block as they decode find
    none, and the youngest are preempted and recomputed later. Under a journal nothing
    of that is rank 0's alone: freed blocks are named by the next pass that uses them, a dropped
    row's recurrent state leaves the follower's merged states through the journaled
    ``filter``, and the recompute is ordinary passes. Every pass's logits equal rank 0's,
    the follower's pool ends equal, and the tokens equal a plain engine's."""
    from mlxbun_core.engine.memory import MemoryConfig
    from mlxbun_core.engine.readings import Reading

    engine, channel, follower = _pair(family, memory=MemoryConfig(margin_bytes=0))
    lane = engine.worker.lanes[0]
    per_block = int(engine.admission.layout.bytes_per_token * 16)
    room = ROOMS[family] * per_block

    def pool_bytes() -> int:
        stats = lane.pool_stats()
        return 0 if stats is None else int(stats["bytes"])

    engine.memory.probe = lambda: Reading(room - pool_bytes(), 0, "test")
    plain = Engine.load(str(tiny_checkpoint(family, seed=3, dtype="float32")), progress=False,
                        batch=8, prompt_cache_bytes=0)
    bodies = [greedy(" ".join(str((i * 7 + j) % 50) for j in range(40 + 10 * i)), 100)
              for i in range(6)]
    try:
        got = run_all(engine, bodies)
        assert [token_ids(r) for r in got] == [token_ids(r) for r in run_all(plain, bodies)]
        counts = engine.memory.counts
        assert counts["out_of_blocks"] >= 1 and counts["preemptions"] >= 1, counts
        assert engine.model.model.same and all(engine.model.model.same)
        blocks = engine.batch_stats()["kv_blocks"]
        assert blocks["bytes"] + engine.memory.step["reserve_bytes"] <= room, blocks
        ours = lane._batch.layout
        engine.worker.run_sync(engine.model.model.ping)
        theirs = follower.replica.layouts[ours.name]
        assert theirs.pool.capacity == ours.pool.capacity
        for a, b in zip(ours.all_stores(), theirs.all_stores()):
            assert mx.array_equal(a.keys, b.keys) and mx.array_equal(a.values, b.values)
        engine.worker.run_sync(engine.prefix.clear)
        assert lane._batch.pool.used == 0
        for _ in range(3):  # a state's drop is journaled when rank 0's object is collected:
            gc.collect()  # one the worker's frame still held goes with its next message
            engine.worker.run_sync(engine.model.model.ping)
            if not follower.replica.states:
                break
        assert not follower.replica.states  # the preempted rows' states went too
    finally:
        close(engine, plain)


def test_an_out_of_memory_under_a_journal_is_a_lost_device(recording):
    """Rank 0 cannot tell how far a pass that ran out of memory got through its
    collectives, so under ``--distributed`` an out-of-memory is not recovered in place (the
    other ranks could pair the rest of that pass with the next one's): the engine ends
    as on a device fault, every request told 503 with a retry for the restarted group,
    and no row is preempted."""
    from mlxbun_core.engine.memory import DEVICE_FAULT, MemoryConfig

    engine, _, _ = _pair("llama", memory=MemoryConfig(fault_alloc=4))
    lost: list[str] = []
    engine.on_fatal = lost.append
    try:
        assert engine.memory.lockstep
        done = finishes(engine, [greedy(p, 30) for p in PROMPTS], together=True)
        assert all(f.reason == "error" and f.retry is not None for f in done), done
        assert {f.retry.code for f in done} == {DEVICE_FAULT}
        assert lost and "--distributed" in lost[0] and "out of memory" in lost[0]
        counts = engine.memory.counts
        assert counts["device_faults"] == 1 and counts["preemptions"] == 0, counts
        assert engine.unavailable is not None and engine.worker.broken
    finally:
        engine.worker.close()
