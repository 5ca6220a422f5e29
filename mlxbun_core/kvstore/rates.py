"""The two rates the restore-vs-recompute check weighs, known in a fresh process.

An SSD entry is worth restoring only when reading it back beats prefilling the tokens it
saves (``engine/prompt_cache.py``). A process that has restored nothing and prefilled
nothing has neither rate, and restored blindly: on an H100 a 24k-token entry took 3.67 s
to restore where prefilling it took 1.59 s. So both are seeded before the first request:

- **restore rate** (bytes a second): ``MLXBUN_SSD_READ_GBS`` when set; else what this
  directory measured before on this device; else a probe now: a scratch entry of
  ``PROBE_BYTES`` written through the writer's own code, its pages dropped from the OS
  cache, read back through the restore path (MLX's loader, every byte hashed, the cache
  objects rebuilt), then removed. The result is kept in ``<dir>/read-rate.json``.
- **prefill rate** (tokens a second): a rate measured on real prompts is kept beside
  this model's entries (``<dir>/<fingerprint>/prefill-rate.json``) and replaces the
  engine's start-up calibration (``PrefillPacer``) at the next start.

Real restores and real prompt chunks then take over.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from ..runconfig import current

log = logging.getLogger("mlxbun.kvstore")

PROBE_BYTES = 64 << 20  # past the fixed costs of one restore; ~0.1 s on a datacenter SSD
READ_FILE = "read-rate.json"
PREFILL_FILE = "prefill-rate.json"
PREFILL_DRIFT = 0.25  # a measured prefill rate this far from the kept one is written


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically, or not at all (a read-only directory measures again next time)."""
    try:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("ssd cache: could not keep %s: %s", path, exc)


def device_key() -> str:
    from .identity import device_identity

    d = device_identity()
    return f"{d.get('device', '')}|{d.get('arch', '')}|mlx {d.get('mlx', '')}"


def env_restore_bps() -> float | None:
    gbs = current().cache.ssd_read_gbs
    return None if gbs is None else gbs * 1e9


def seed_restore_rate(store: Any) -> tuple[float | None, str]:
    """``(bytes a second, where it came from)`` for ``store`` (an ``SsdStore``) before any
    restore; runs the probe on the calling thread (the MLX owner) when nothing is known."""
    env = env_restore_bps()
    if env is not None:
        return env, "env MLXBUN_SSD_READ_GBS"
    path, key = store.root / READ_FILE, device_key()
    kept = read_json(path).get(key)
    if isinstance(kept, dict) and isinstance(kept.get("bps"), (int, float)) and kept["bps"] > 0:
        return float(kept["bps"]), f"measured {kept.get('measured_at', '?')}"
    try:
        bps = probe(store)
    except Exception as exc:  # a full or read-only disk: the first real restore measures
        log.info("ssd cache: could not measure the restore rate (%s)", exc)
        return None, "unknown"
    write_json(path, {**read_json(path), key: {"bps": bps,
                                                 "measured_at": time.strftime("%Y-%m-%d")}})
    return bps, "measured now"


def probe(store: Any, nbytes: int = PROBE_BYTES) -> float:
    """Bytes a second a restore of a ``nbytes`` entry runs at: written as the writer
    writes, its pages dropped, read as a restore reads."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    from .fileformat import drop_pages, read_header, write_entry

    heads, dim = 8, 128
    tokens = max(1, nbytes // (2 * heads * dim * 2))  # keys and values, bfloat16
    cache = KVCache()
    shape = (1, heads, tokens, dim)
    cache.update_and_fetch(mx.random.normal(shape).astype(mx.bfloat16),
                           mx.random.normal(shape).astype(mx.bfloat16))
    job = store.prepare("probe", list(range(tokens)), [cache], "assistant")
    if job is None:
        raise RuntimeError("the probe cache could not be encoded")
    directory = store.root / f".probe-{uuid.uuid4().hex}"
    try:
        directory.mkdir(parents=True)
        from . import codec

        path, size = write_entry(directory, job.header, job.tokens,
                                 [codec.host_view(t) for t in job.tensors], job.mx_dtypes,
                                 strong=store.config.verify)
        assert path is not None
        with open(path, "rb", buffering=0) as f:
            drop_pages(f)
        t0 = time.perf_counter()
        header = read_header(path)
        restored = store.load(path, header)
        mx.eval([c.state for c in restored])
        seconds = time.perf_counter() - t0
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return size / max(seconds, 1e-6)


class PrefillRecord:
    """The prefill rate measured on real prompts, kept beside this model's entries."""

    def __init__(self, home: Path):
        self.path = home / PREFILL_FILE
        self.key = device_key()
        kept = read_json(self.path).get(self.key)
        self.tps: float | None = (float(kept["tps"]) if isinstance(kept, dict)
                                  and isinstance(kept.get("tps"), (int, float))
                                  and kept["tps"] > 0 else None)

    def note(self, tps: float | None) -> None:
        """Keep ``tps`` when it moved past :data:`PREFILL_DRIFT` from the kept rate."""
        if not tps or (self.tps and abs(tps - self.tps) <= PREFILL_DRIFT * self.tps):
            return
        self.tps = tps
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json(self.path, {**read_json(self.path), self.key: {
            "tps": round(tps, 1), "measured_at": time.strftime("%Y-%m-%d")}})
