"""In-flight generation checkpoints (``--generation-checkpoint N``, beside ``--ssd-cache``).

Every N tokens a qualifying request hands out, a small snapshot goes to disk: the
request's identity, its prompt length, the tokens emitted so far and the already-sampled
next token (the last token out, whose KV is not computed yet). The KV itself is the SSD
tier's business: it keys prefix KV by tokens, so a resumed request simply asks the
prefix cache for ``prompt + emitted + next`` and prefills whatever the tiers do not hold.

An identical retry (after a disconnect, or a restart on the same directory) finds the
snapshot: its tokens go to the client at once, through the same text session (the wire
shape is the one an uninterrupted run sends), and the model continues from the saved
next token. A completed generation removes its snapshot; a cancelled or failed one keeps
the latest. Greedy requests (and seeded ones on the serial lane, whose random stream is
advanced past the replayed draws) continue exactly as an uninterrupted run would.

Qualifying: greedy or seeded sampling, no media, prompt embeddings, grammar, fill,
log-probs, prompt scoring or speculation (the others run as before, uncheckpointed).

Snapshots nobody resumes (a cancelled request never retried) would pile up: files older
than :data:`MAX_AGE_S` go, and past :data:`MAX_BYTES` the oldest go first, swept when the
store opens and after every write.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..events import Admitted, Event

if TYPE_CHECKING:
    from ..kvstore import SsdConfig
    from ..kvstore.store import SsdStore
    from .job import GenerationJob

log = logging.getLogger("mlxbun.engine")

FOLDER = "generations"  # under the --ssd-cache directory, beside the fingerprint folders
FORMAT = "mlxbun-generation-checkpoint/1"
COMPLETED = ("stop", "length", "tool_calls")
MAX_AGE_S = 24 * 3600.0  # a retry comes within minutes, a restart within hours
MAX_BYTES = 64 << 20  # a token takes about 7 bytes of JSON: some ten million tokens


def open_store(config: SsdConfig | None, tier: SsdStore | None) -> CheckpointStore | None:
    """The snapshot store of ``--generation-checkpoint`` (None: off, or no SSD tier)."""
    if config is None or tier is None or not config.checkpoint_every:
        return None
    return CheckpointStore(tier.root, config.checkpoint_every)


def qualifies(job: GenerationJob) -> bool:
    """Whether ``job`` may be checkpointed and resumed with the same output (greedy, or
    seeded with one random draw per token), and nothing rides beside its tokens."""
    req, s = job.request, job.request.sampling
    plain = (req.media is None and req.input_embeddings is None and req.grammar is None
             and job.fill is None and not s.wants_logprobs and not req.score_prompt
             and job.spec is None and job.draft is None and job.cache_namespace is not None
             and job.limit != 0)
    greedy = s.temperature == 0 and s.hlg is None
    seeded = s.seed is not None and not s.xtc_probability
    return plain and (greedy or seeded)


def identity(job: GenerationJob, tier: SsdStore) -> str | None:
    """The request's identity: its durable namespace (model fingerprint, adapter files,
    KV scheme), the rendered prompt tokens, the sampling settings (seed included), the
    budget and the stop/parse settings that shape its text; None when the namespace
    cannot be written (an adapter no longer mounted)."""
    namespace = tier.key(job.cache_namespace)
    if namespace is None:
        return None
    req = job.request
    sampling = {f.name: getattr(req.sampling, f.name)
                for f in dataclasses.fields(req.sampling) if f.name != "extra_processors"}
    parts = {"namespace": namespace, "prompt": req.prompt_tokens, "sampling": sampling,
             "max_tokens": req.max_tokens, "limit": job.limit, "stop": req.stop,
             "think": [req.think_start, req.think_end, req.in_reasoning],
             "tool_parser": type(req.tool_parser).__name__ if req.tool_parser else None}
    text = json.dumps(parts, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


class CheckpointStore:
    """The snapshot files under ``<ssd-cache>/generations/`` and their background writer
    (writes and removals are applied in order, off the worker thread)."""

    def __init__(self, root: Path, every: int, *, max_age_s: float = MAX_AGE_S,
                 max_bytes: int = MAX_BYTES):
        self.dir = Path(root) / FOLDER
        self.dir.mkdir(parents=True, exist_ok=True)
        self.every, self.max_age_s, self.max_bytes = every, max_age_s, max_bytes
        self.saved = self.removed = self.resumed = self.resumed_tokens = self.failed = 0
        self.expired = 0
        # the files on disk (snapshots, and temp files a kill left): path -> (mtime, bytes);
        # read once here, then kept by the writer thread (its only user)
        self._on_disk = {p: (st.st_mtime, st.st_size) for p in self.dir.iterdir()
                         if p.name.endswith((".json", ".tmp")) and (st := p.stat())}
        self._sweep()
        if self.expired:
            log.info("generation checkpoint: %d expired snapshots removed", self.expired)
        self._lock = threading.Lock()
        # key -> the snapshot this process queued last (None: removed); kept small: a
        # key leaves once its last queued write is done
        self._latest: dict[str, dict[str, Any] | None] = {}
        self._ops: queue.Queue[tuple[str, str, dict[str, Any] | None]] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="mlxbun-gencp", daemon=True)
        self._thread.start()

    def path(self, key: str) -> Path:
        return self.dir / f"{key}.json"

    def load(self, key: str, prompt_tokens: int) -> list[int] | None:
        """The tokens a snapshot of ``key`` emitted, its next token last (None: none, or
        one that does not belong to this prompt). What this process queued wins over the
        disk, whose writes may still be on their way."""
        with self._lock:
            if key in self._latest:
                record = self._latest[key]
                return None if record is None else [*record["emitted"], record["next"]]
        try:
            data = json.loads(self.path(key).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("format") != FORMAT \
                or data.get("key") != key or data.get("prompt_tokens") != prompt_tokens:
            return None
        emitted, nxt = data.get("emitted"), data.get("next")
        if not isinstance(emitted, list) or not isinstance(nxt, int) \
                or not all(isinstance(t, int) for t in emitted):
            return None
        return [*emitted, nxt]

    def save(self, key: str, prompt_tokens: int, output: list[int]) -> None:
        """Queue a snapshot: ``output`` is every token handed out, the next one last."""
        record = {"format": FORMAT, "key": key, "prompt_tokens": prompt_tokens,
                  "emitted": output[:-1], "next": output[-1]}
        with self._lock:
            self._latest[key] = record
            self._ops.put(("save", key, record))

    def remove(self, key: str) -> None:
        with self._lock:
            self._latest[key] = None
            self._ops.put(("remove", key, None))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write and removal is on disk."""
        done = threading.Event()
        self._ops.put(("mark", "", {"done": done}))
        return done.wait(timeout)

    def pending(self) -> int:
        return self._ops.qsize()

    def files(self) -> int:
        return sum(1 for p in self.dir.glob("*.json"))

    def _run(self) -> None:
        while True:
            op, key, record = self._ops.get()
            try:
                if op == "mark":
                    assert record is not None
                    record["done"].set()
                elif op == "save":
                    self._write(key, record)
                    self.saved += 1
                    self._sweep(keep=self.path(key))
                else:
                    self.path(key).unlink(missing_ok=True)
                    self._on_disk.pop(self.path(key), None)
                    self.removed += 1
            except OSError as exc:
                self.failed += 1
                log.warning("generation checkpoint: %s failed: %s", op, exc)
            with self._lock:
                if op != "mark" and self._latest.get(key, 0) is record:
                    del self._latest[key]  # the disk says what it says now

    def _write(self, key: str, record: dict[str, Any] | None) -> None:
        """Atomically: a temp file, fsync, rename (a kill leaves the old or the new)."""
        tmp = self.dir / f".{key}.tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path(key))
        st = self.path(key).stat()
        self._on_disk[self.path(key)] = (st.st_mtime, st.st_size)

    def _sweep(self, keep: Path | None = None) -> None:
        """Remove files older than ``max_age_s``, then the oldest until the rest fit in
        ``max_bytes``; ``keep`` (the snapshot just written) stays."""
        total = sum(size for _, size in self._on_disk.values())
        oldest_first = sorted(self._on_disk.items(), key=lambda item: item[1][0])
        now = time.time()
        for path, (mtime, size) in oldest_first:
            if path == keep or (now - mtime <= self.max_age_s and total <= self.max_bytes):
                continue
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("generation checkpoint: removing %s failed: %s", path.name, exc)
                continue
            del self._on_disk[path]
            total -= size
            self.expired += 1

    def stats(self) -> dict[str, Any]:
        return {"every": self.every, "dir": str(self.dir), "files": self.files(),
                "saved": self.saved, "removed": self.removed, "resumed": self.resumed,
                "resumed_tokens": self.resumed_tokens, "failed": self.failed,
                "expired": self.expired, "pending": self.pending()}


class Tracker:
    """One checkpointed job's watcher (``job.on_emit``, on the worker thread): snapshots
    every ``every`` tokens, a replayed prefix sent right after admission, and the end
    (completed: removed; cancelled or failed: the latest kept)."""

    def __init__(self, store: CheckpointStore, key: str, job: GenerationJob,
                 prompt_tokens: int, replayed: list[int], replay: list[Event]):
        self.store, self.key, self.job = store, key, job
        self.prompt_tokens = prompt_tokens
        self.replayed, self.replay = replayed, replay
        self.mark = len(replayed)  # output length at the last snapshot
        self.settled = False

    def output(self) -> list[int]:
        return [*self.replayed, *self.job.output]

    def __call__(self, events: list[Event]) -> list[Event]:
        if self.replay:
            at = next((i + 1 for i, ev in enumerate(events) if isinstance(ev, Admitted)), None)
            if at is not None:
                admitted = events[at - 1]
                assert isinstance(admitted, Admitted)
                cached = min(admitted.cached_tokens, self.prompt_tokens)  # of the prompt
                self.job.session.usage.cached_tokens = cached
                events = [*events[:at - 1], dataclasses.replace(admitted, cached_tokens=cached),
                          *self.replay, *events[at:]]
                self.replay = []
        if self.settled:
            return events
        finished = self.job.session.finished
        n = len(self.replayed) + len(self.job.output)  # (the list is built only to save it)
        if finished is not None:
            self.settled = True
            if finished.reason in COMPLETED and finished.error is None:
                self.store.remove(self.key)
            elif n > self.mark:  # cancelled or failed: the latest is kept
                self.store.save(self.key, self.prompt_tokens, self.output())
        elif n - self.mark >= self.store.every:
            self.mark = n
            self.store.save(self.key, self.prompt_tokens, self.output())
        return events


def attach(store: CheckpointStore | None, tier: SsdStore | None, job: GenerationJob) -> None:
    """Checkpoint ``job`` if it qualifies; resume it from its snapshot if one exists
    (before it is queued, on the event loop): its prompt grows by the saved tokens, its
    session has already handed them out (their events follow its admission), and its
    usage still counts the original prompt."""
    if store is None or tier is None or not qualifies(job):
        return
    key = identity(job, tier)
    if key is None:
        return
    req, session = job.request, job.session
    prompt_n = len(req.prompt_tokens)
    saved = store.load(key, prompt_n) or []
    if saved and not _continues(job, saved):
        saved = []  # (a snapshot no run of this request could have left: start over)
    replay: list[Event] = []
    for token in saved:
        replay += session.step(token, None)
    if saved:
        req.prompt_tokens = [*req.prompt_tokens, *saved]
        session.usage.prompt_tokens = prompt_n
        job.replayed = len(saved)
        store.resumed += 1
        store.resumed_tokens += len(saved)
        log.info("generation checkpoint: resumed %s at %d tokens (prompt %d tok)",
                 key[:12], len(saved), prompt_n)
    job.on_emit = Tracker(store, key, job, prompt_n, saved, replay)
    job.keep_kv_on_cancel = True


def _continues(job: GenerationJob, saved: list[int]) -> bool:
    """Whether replaying ``saved`` leaves the reply open: within its budget, no EOS, no
    stop string (a completed run removes its snapshot, so only a foreign file fails)."""
    session = job.session
    if job.limit is not None and len(saved) >= job.limit:
        return False
    if session.eos.intersection(saved):
        return False
    text = session.tokenizer.decode(saved)
    return not any(stop in text for stop in job.request.stop)
