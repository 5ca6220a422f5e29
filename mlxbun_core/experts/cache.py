"""Routed experts streamed from the checkpoint: a MoE model bigger than memory (GLM-5.x,
and any mlx-lm MoE whose experts are a ``SwitchGLU``: qwen3_moe, mixtral, ...).

With an expert byte budget the model loads lazily; every routed-expert tensor
(``mlp.experts.N.*`` in HF layout, Mixtral's ``block_sparse_moe.experts.N.w1|w2|w3``, or
rows of a stacked ``switch_mlp.*``) is
dropped before anything is read, so attention, shared experts, dense layers,
embeddings and head are all that sit in memory at start. Each MoE layer's forward
then

1. evaluates its routing (one sync per MoE layer: the expert ids must be known to
   read them) and, in the same evaluation, the *next* MoE layer's router applied to
   this layer's input, a cheap guess at what that layer will want;
2. starts reads of the guessed experts on a thread pool (they overlap this layer's
   expert math and the next layer's attention);
3. takes the experts this step needs (unique ids over the whole batch) from an LRU
   keyed ``(layer, expert)`` with a byte cap, reading every miss concurrently with
   ``os.pread`` at the offsets the safetensors headers give;
4. stacks them into compact ``[n, ...]`` tensors and runs mlx-lm's own SwitchGLU on
   remapped indices, so the math is the resident model's, token for token.

The cache never holds more than its budget. A step whose layer needs more experts
than the budget holds (a long prefill touches most of a layer) runs in budget-sized
groups, each evaluated before the next is read (``split_steps``), so expert memory
stays at the budget plus prefetches in flight (at most one layer's guesses).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ExpertKey = tuple[int, int]  # (layer, expert)
Weights = dict[str, Any]  # "gate_proj.weight" -> mx.array

_BLOCK = r"model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)"
_PER_EXPERT = re.compile(_BLOCK + r"\.experts\.(\d+)\.(\w+_proj|w[123])\.(\w+)$")
_STACKED = re.compile(_BLOCK + r"\.switch_mlp\.(\w+_proj)\.(\w+)$")
_MIXTRAL = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}  # (mlx-lm's sanitize)
_NUMPY = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "U32": np.uint32,
          "U8": np.uint8, "I8": np.int8, "I32": np.int32}


@dataclass(frozen=True)
class Slice:
    """Where one expert's part of one tensor lies: a contiguous byte range of a file."""

    file: str
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]


@dataclass
class ExpertIndex:
    """Every routed expert's byte ranges, from the safetensors headers alone."""

    parts: dict[ExpertKey, dict[str, Slice]] = field(default_factory=dict)
    disk_bytes: int = 0  # all *.safetensors files of the checkpoint

    @classmethod
    def scan(cls, path: Path) -> ExpertIndex:
        index = cls()
        for file in sorted(Path(path).glob("*.safetensors")):
            index.disk_bytes += file.stat().st_size
            with open(file, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(n))
            for name, info in header.items():
                if name != "__metadata__":
                    index.add_tensor(str(file), 8 + n, name, info)
        return index

    def add_tensor(self, file: str, base: int, name: str, info: dict) -> None:
        """Record the expert slices of tensor ``name`` (its safetensors header entry
        ``info``, offsets from ``base`` in ``file``); other tensors are left out."""
        if "weight_scale_inv" in name and (".experts." in name or ".switch_mlp." in name):
            raise ValueError(f"{name}: block-FP8 expert weights cannot be streamed "
                             "(convert the checkpoint with mlx-lm first)")
        start, end = info["data_offsets"]
        dtype, shape = info["dtype"], tuple(info["shape"])
        if dtype not in _NUMPY:
            raise ValueError(f"{name}: dtype {dtype} cannot be streamed")
        if m := _PER_EXPERT.match(name):
            layer, expert, proj, part = int(m[1]), int(m[2]), _MIXTRAL.get(m[3], m[3]), m[4]
            self.parts.setdefault((layer, expert), {})[f"{proj}.{part}"] = Slice(
                file, base + start, end - start, dtype, shape)
        elif m := _STACKED.match(name):
            layer, proj, part = int(m[1]), m[2], m[3]
            row = (end - start) // shape[0]
            for e in range(shape[0]):
                self.parts.setdefault((layer, e), {})[f"{proj}.{part}"] = Slice(
                    file, base + start + e * row, row, dtype, shape[1:])

    def expert_bytes(self, key: ExpertKey) -> int:
        return sum(s.nbytes for s in self.parts[key].values())

    def layer_bytes(self, layers: Iterable[int]) -> int:
        wanted = set(layers)
        return sum(self.expert_bytes(k) for k in self.parts if k[0] in wanted)


class ExpertReader:
    """Reads one expert's tensors with ``os.pread`` (thread-safe: no shared offsets)."""

    def __init__(self, index: ExpertIndex):
        self.index = index
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def _fd(self, file: str) -> int:
        with self._lock:
            if file not in self._fds:
                self._fds[file] = os.open(file, os.O_RDONLY)
            return self._fds[file]

    def read(self, key: ExpertKey) -> tuple[dict[str, np.ndarray], int]:
        """The expert's host arrays (bf16 kept as raw uint16) and the bytes read."""
        out, total = {}, 0
        for part, s in self.index.parts[key].items():
            raw = os.pread(self._fd(s.file), s.nbytes, s.offset)
            if len(raw) != s.nbytes:
                raise OSError(f"short read of {part} of expert {key} in {s.file}")
            out[part] = np.frombuffer(raw, dtype=_NUMPY[s.dtype]).reshape(s.shape)
            total += s.nbytes
        return out, total

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()


def to_mlx(host: dict[str, np.ndarray], dtypes: dict[str, str]) -> Weights:
    import mlx.core as mx

    out = {}
    for part, a in host.items():
        arr = mx.array(a)
        out[part] = arr.view(mx.bfloat16) if dtypes[part] == "BF16" else arr
    return out


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes_read: int = 0
    uncached_reads: int = 0  # misses used once because the budget could not hold them
    split_steps: int = 0  # layer steps run in budget-sized groups (more experts than fit)
    read_seconds: float = 0.0  # wall time the forward waited on reads
    prefetch_issued: int = 0
    prefetch_used: int = 0  # misses whose read a prefetch had already started
    prefetch_wasted: int = 0  # prefetched experts the layer did not need


class ExpertCache:
    """An LRU of resident experts under a byte cap, filled by concurrent reads.

    ``fetch`` is called from the model's forward (one thread); ``prefetch`` reads run
    on the pool and are only handed to the cache by a later ``fetch``, so the LRU
    itself is touched by one thread and the cap holds at every moment.
    """

    def __init__(self, reader: ExpertReader, budget_bytes: int, *, workers: int = 4,
                 convert: Callable[[dict[str, np.ndarray], dict[str, str]], Weights] = to_mlx):
        self.reader = reader
        self.budget_bytes = int(budget_bytes)
        self.convert = convert
        self.stats = CacheStats()
        self.resident_bytes = 0
        self.working = 0  # experts the last fetch needed
        self._lru: OrderedDict[ExpertKey, tuple[Weights, int]] = OrderedDict()
        self._pending: dict[ExpertKey, Future] = {}
        self._pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="mlxbun-experts")

    def __contains__(self, key: ExpertKey) -> bool:
        return key in self._lru

    def _read(self, key: ExpertKey) -> Future:
        return self._pool.submit(self.reader.read, key)

    def prefetch(self, layer: int, experts: Iterable[int]) -> None:
        """Start reading experts ``layer`` will probably want (not already held)."""
        for e in experts:
            key = (layer, int(e))
            if key not in self._lru and key not in self._pending:
                self._pending[key] = self._read(key)
                self.stats.prefetch_issued += 1

    def plan(self, layer: int, experts: list[int]) -> list[list[int]]:
        """``experts`` split into groups that each fit the budget, those already held
        first (one group whenever the budget holds them all)."""
        held = [e for e in experts if (layer, e) in self._lru]
        groups: list[list[int]] = [[]]
        size = 0
        for e in held + [e for e in experts if (layer, e) not in self._lru]:
            n = self.reader.index.expert_bytes((layer, e))
            if groups[-1] and size + n > self.budget_bytes:
                groups.append([])
                size = 0
            groups[-1].append(e)
            size += n
        self.stats.split_steps += len(groups) > 1
        return groups

    def fetch(self, layer: int, experts: list[int]) -> list[Weights]:
        """The weights of ``experts`` of ``layer``, in order; misses read concurrently."""
        keys = [(layer, int(e)) for e in experts]
        self.working = len(keys)
        futures: dict[ExpertKey, Future] = {}
        for key in keys:
            if key in self._lru:
                self._lru.move_to_end(key)
                self.stats.hits += 1
            else:
                self.stats.misses += 1
                pending = self._pending.pop(key, None)
                self.stats.prefetch_used += pending is not None
                futures[key] = pending or self._read(key)
        for key in [k for k in self._pending if k[0] == layer]:  # guessed wrong
            wasted = self._pending.pop(key)
            self.stats.prefetch_wasted += 1
            if not wasted.cancel():  # already read (or reading): its bytes still count
                self.stats.bytes_read += wasted.result()[1]
        transient: dict[ExpertKey, Weights] = {}
        t0 = time.perf_counter()
        for key, fut in futures.items():
            host, nbytes = fut.result()
            self.stats.bytes_read += nbytes
            dtypes = {p: s.dtype for p, s in self.reader.index.parts[key].items()}
            weights = self.convert(host, dtypes)
            if not self._admit(key, weights, nbytes, protect=set(keys)):
                transient[key] = weights
                self.stats.uncached_reads += 1
        self.stats.read_seconds += time.perf_counter() - t0
        return [self._lru[k][0] if k in self._lru else transient[k] for k in keys]

    def _admit(self, key: ExpertKey, weights: Weights, nbytes: int,
               protect: set[ExpertKey]) -> bool:
        """Hold ``key`` if room can be made without evicting what this step uses."""
        victims, room = [], self.budget_bytes - self.resident_bytes
        for old, (_, size) in self._lru.items():  # oldest first
            if room >= nbytes:
                break
            if old not in protect:
                victims.append(old)
                room += size
        if room < nbytes:
            return False
        for old in victims:
            self.resident_bytes -= self._lru.pop(old)[1]
            self.stats.evictions += 1
        self._lru[key] = (weights, nbytes)
        self.resident_bytes += nbytes
        return True

    def snapshot(self) -> dict[str, Any]:
        s = self.stats
        asked = s.hits + s.misses
        return {"budget_bytes": self.budget_bytes, "resident_bytes": self.resident_bytes,
                "resident_experts": len(self._lru), "working_experts": self.working,
                "hits": s.hits, "misses": s.misses, "evictions": s.evictions,
                "hit_rate": round(s.hits / asked, 4) if asked else None,
                "bytes_read": s.bytes_read, "uncached_reads": s.uncached_reads,
                "split_steps": s.split_steps,
                "read_wait_seconds": round(s.read_seconds, 4),
                "prefetch": {"issued": s.prefetch_issued, "used": s.prefetch_used,
                             "wasted": s.prefetch_wasted}}

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.reader.close()
