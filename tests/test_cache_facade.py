"""mlx-lm's single-sequence caches change between forward passes only through
``cache_ops.py``, which is what lets ``--distributed`` mirror them without patching
mlx-lm's classes (``distributed/mirror.py``).

Two halves: a scan of our code that fails on a module going around the facade (calling
mlx-lm's ``make_prompt_cache`` / ``trim_prompt_cache``, a cache's ``trim``, ``from_state``,
a ``deepcopy`` where caches live, setting a cache's ``state``), and the facade itself on
a real tiny checkpoint loaded twice: what rank 0 does through it is recorded, and a
follower replaying the record holds caches that give the same logits.
"""

from __future__ import annotations

import ast
import gc
import pickle
from pathlib import Path

import mlx.core as mx
import pytest

from mlxbun_core import cache_ops
from mlxbun_core.distributed import mirror
from mlxbun_core.testing.checkpoints import tiny_checkpoint

ROOT = Path(__file__).resolve().parent.parent
TREES = [ROOT / "mlxbun_core", *sorted((ROOT / "plugins").glob("*/mlxbun_*"))]
FACADE = ROOT / "mlxbun_core" / "cache_ops.py"
# where mlx-lm caches are held (and the family plugins): a deep copy there is a copy of
# a cache, a ``state`` set there a cache's
CACHE_HOLDERS = ("engine", "distributed", "kvstore", "kvquant")
THEIR_FUNCTIONS = {"make_prompt_cache", "trim_prompt_cache"}
# what a cache holds: ``x.state = ...`` (or its keys, values, offset, recurrent arrays)
# written from outside
STATE = {"state", "meta_state", "keys", "values", "offset", "cache"}
# modules whose writes of those are not a single-sequence cache changing between passes
STATE_WRITERS = {
    # the batch lane's merged recurrent states: its journal records them
    # (engine/batch/journal.py), the followers replay that
    "mlxbun_core/engine/batch/states.py",
    # blocks exported into a fresh mlx-lm cache: a journaled layout refuses to export
    # (tests/test_distributed_replay.py), so nothing here runs under --distributed
    "mlxbun_core/engine/batch/layout.py",
    # TurboKVCache.from_state: our own cache class building an instance of itself
    "mlxbun_core/kvquant/turbo.py",
}


def bypasses(tree: ast.AST, rel: str) -> list[tuple[int, str]]:
    """``(line, what)`` of every change to an mlx-lm cache in ``tree`` (the module at
    ``rel``) that does not go through the facade."""
    holder = rel.startswith("plugins/") or rel.split("/")[1] in CACHE_HOLDERS
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mlx_lm"):
            out += [(node.lineno, f"imports {a.name}") for a in node.names
                    if a.name in THEIR_FUNCTIONS]
        elif isinstance(node, ast.Attribute) and node.attr in THEIR_FUNCTIONS:
            out.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.Call):
            out += _call(node, holder)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and holder \
                and rel not in STATE_WRITERS:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out += [(node.lineno, f"sets .{t.attr}") for t in _flat(targets)
                    if isinstance(t, ast.Attribute) and t.attr in STATE
                    and not (isinstance(t.value, ast.Name) and t.value.id == "self")]
    return out


def _call(node: ast.Call, holder: bool) -> list[tuple[int, str]]:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else \
        func.id if isinstance(func, ast.Name) else ""
    if name in ("trim", "from_state") and isinstance(func, ast.Attribute) \
            and not (isinstance(func.value, ast.Name) and func.value.id == "cache_ops"):
        return [(node.lineno, f".{name}()")]
    if name == "deepcopy" and holder:
        return [(node.lineno, "deepcopy()")]
    if name in ("setattr", "__setattr__") and len(node.args) >= 2 \
            and isinstance(node.args[1], ast.Constant) and node.args[1].value in STATE:
        return [(node.lineno, f"setattr {node.args[1].value}")]
    return []


def _flat(targets: list[ast.expr]) -> list[ast.expr]:
    out: list[ast.expr] = []
    for t in targets:
        out += _flat(list(t.elts)) if isinstance(t, (ast.Tuple, ast.List)) else [t]
    return out


def test_no_module_but_the_facade_changes_an_mlx_lm_cache():
    found = []
    for tree in TREES:
        for path in sorted(tree.rglob("*.py")):
            if path == FACADE:
                continue
            rel = str(path.relative_to(ROOT))
            found += [f"{rel}:{line}: {what}" for line, what in
                      bypasses(ast.parse(path.read_text(encoding="utf-8")), rel)]
    assert not found, ("mlx-lm caches changed around cache_ops.py (a distributed "
                       "serve would not mirror these):\n" + "\n".join(found))


@pytest.mark.parametrize("source, rel, want", [
    ("from mlx_lm.models.cache import make_prompt_cache\nc = make_prompt_cache(m)\n",
     "mlxbun_core/webapp/x.py", ["imports make_prompt_cache"]),
    ("import mlx_lm.models.cache as mc\nmc.trim_prompt_cache(c, 3)\n",
     "mlxbun_core/engine/lanes/x.py", [".trim_prompt_cache"]),
    ("def f(cache):\n    for c in cache:\n        c.trim(2)\n",
     "mlxbun_core/engine/x.py", [".trim()"]),
    ("import copy\ndef f(cache):\n    return copy.deepcopy(cache)\n",
     "mlxbun_core/engine/lanes/x.py", ["deepcopy()"]),
    ("import copy\ndef f(body):\n    return copy.deepcopy(body)\n",
     "mlxbun_core/server/x.py", []),  # a request body, not a cache
    ("def f(c, saved):\n    c.state = saved\n    c.meta_state, x = saved, 1\n",
     "mlxbun_core/engine/x.py", ["sets .state", "sets .meta_state"]),
    ("def f(c, k):\n    c.keys = k[..., :c.offset, :]\n    c.cache = [None]\n",
     "mlxbun_core/engine/x.py", ["sets .keys", "sets .cache"]),
    ("class A:\n    def go(self):\n        self.state = 'idle'\n",
     "mlxbun_core/engine/x.py", []),  # our own object's state
    ("def f(server):\n    server.state = 'failed'\n",
     "mlxbun_core/webchat/x.py", []),  # no caches there
    ("from .. import cache_ops\ndef f(c):\n    cache_ops.trim(c, 2)\n",
     "mlxbun_core/engine/x.py", []),  # the facade itself
    ("def f(cls, s):\n    return cls.from_state(s)\n", "mlxbun_core/kvstore/x.py",
     [".from_state()"]),
    ("def f(c, s):\n    setattr(c, 'state', s)\n", "plugins/q/mlxbun_q/x.py",
     ["setattr state"]),
])
def test_the_scan_sees_a_bypass(source, rel, want):
    assert sorted(w for _, w in bypasses(ast.parse(source), rel)) == sorted(want)


# -- the facade, recorded and replayed ----------------------------------------------------

@pytest.fixture(scope="module")
def two_copies():
    """(rank 0's model, the follower's): one tiny checkpoint loaded twice."""
    from mlx_lm import load

    path = str(tiny_checkpoint("llama", seed=5, dtype="float32"))
    return load(path)[0], load(path)[0]


@pytest.fixture
def recording(two_copies):
    mirror.install(recording=True, model=two_copies[1])
    mirror.RECORDER.take()
    yield mirror.RECORDER
    mirror.RECORDER.on = False
    mirror.RECORDER.take()


def _ship(ops: list[tuple]) -> list[tuple]:
    """What the channel does to a record: it must be plain data."""
    return pickle.loads(pickle.dumps(ops))


def test_made_copied_and_trimmed_caches_replay_to_the_same_logits(two_copies, recording):
    """Rank 0 makes caches, reads a prompt (a forward pass: not recorded), keeps a copy,
    trims the copy back, compacts it and reads on from there; the follower replays each record
    before each pass and, running the same passes on its own objects, gets the same
    logits to the bit. A copy rank 0 lets go is dropped on the follower."""
    ours, theirs = two_copies
    follower = mirror.Replayer()
    prompt = mx.array([[3, 14, 15, 92, 65, 35, 89, 79]])

    def forward(cache, tokens):  # rank 0's pass, then the follower's after the record
        enc = recording.encode(cache)
        with recording.quiet():
            mine = ours(tokens, cache=cache)
        follower.replay(_ship(recording.take()))
        with recording.quiet():
            other = theirs(tokens, cache=follower.caches(_ship([enc])[0]))
        same.append(bool(mx.array_equal(mine, other)))

    same: list[bool] = []
    cache = cache_ops.make(ours)
    forward(cache, prompt)
    assert recording.take() == []  # the pass itself recorded nothing
    kept = cache_ops.copy(cache)
    assert cache_ops.trim(kept, 5) == 5 and kept[0].offset == 3 and cache[0].offset == 8
    cache_ops.compact(kept)
    assert kept[0].keys.shape[2] == 3  # the buffer's tail given back
    ops = recording.take()
    assert [op[0] for op in ops] == ["copy", "trim", "compact"]
    follower.replay(_ship(ops))
    uid = recording.encode(kept)[1][0][1]
    assert follower.objects[uid].keys.shape == kept[0].keys.shape
    forward(kept, prompt[:, 3:7])
    assert follower.objects[uid].offset == kept[0].offset == 7
    assert same == [True, True]
    before = len(follower.objects)
    del kept
    gc.collect()
    follower.replay(_ship(recording.take()))
    assert len(follower.objects) == before - len(cache)  # the copy's layers went too


def test_a_cache_rebuilt_from_saved_arrays_fails_loudly_on_the_follower(two_copies,
                                                                        recording):
    """Rank 0 alone holds its shard's arrays: a rebuild from them is recorded as
    something a follower cannot mirror, and replaying it raises."""
    from mlx_lm.models.cache import KVCache

    cache = cache_ops.make(two_copies[0])
    with recording.quiet():
        two_copies[0](mx.array([[1, 2, 3]]), cache=cache)
    rebuilt = cache_ops.from_state(KVCache, cache[0].state)
    assert rebuilt.offset == 3
    ops = _ship(recording.take())
    assert ops[-1] == ("unreplayable", "a KVCache rebuilt from saved arrays")
    with pytest.raises(RuntimeError, match="cannot mirror: a KVCache rebuilt"):
        mirror.Replayer().replay(ops)


def test_no_recorder_no_record(two_copies):
    """Off ``--distributed`` (no recorder installed, or rank 0's not recording) the facade
    is mlx-lm's functions and nothing more."""
    mirror.RECORDER.on = False
    mirror.RECORDER.take()
    cache = cache_ops.make(two_copies[0])
    cache_ops.trim(cache_ops.copy(cache), 1)
    assert mirror.RECORDER.take() == []
