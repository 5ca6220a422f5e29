"""The on-disk entry: a safetensors file whose metadata carries a checked header.

::

    u64 header length | safetensors JSON header | token ids (int32) | tensor 0 | tensor 1 ...

The safetensors header lists ``tokens`` and ``t0``, ``t1``, ... (their dtypes, shapes and
offsets); its ``__metadata__`` holds our own header (a JSON string: format, fingerprint,
namespace, token hash, cache layout, tensor table, content hashes) and ``check``, the
xxh64 of that string. Being a plain safetensors file, an entry is restored by MLX's own
loader (``mx.load``: native reads straight into MLX memory), then every tensor byte is
hashed and compared; the scan at start-up reads only the header and the token ids.

A reader checks the header hash, the file size, the token hash and that the safetensors
table agrees with ours before trusting anything, and the content hash after loading;
:class:`CorruptEntry` means "remove this file and treat it as a miss". Hashes have a fixed
width: the writer streams tensors to disk while hashing them and patches the real digests
into the header last. Files appear only by ``rename`` after ``fsync``, so a reader never
sees a torn file under its final name; a crash leaves at most a ``.tmp-*`` file, which the
next start reaps.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

FORMAT = "mlxbun-kv"
VERSION = 1
SUFFIX = ".mlxkv"
TMP_PREFIX = ".tmp-"
_LEN = struct.Struct("<Q")
MAX_HEADER = 64 << 20
_ZERO_FAST = "0" * 32  # xxh3_128 hex
_ZERO_STRONG = "0" * 64  # blake2b-256 hex
# MLX dtype name -> safetensors dtype
ST_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64",
             "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64", "uint8": "U8",
             "uint16": "U16", "uint32": "U32", "uint64": "U64", "bool": "BOOL",
             "complex64": "C64"}


class CorruptEntry(Exception):
    """A file that must not be served: torn, truncated, bit-flipped or foreign."""


@dataclass
class TensorSpec:
    mx_dtype: str  # the MLX dtype name
    shape: tuple
    offset: int  # from the data start
    nbytes: int


def token_hash(tokens: np.ndarray) -> str:
    return xxhash.xxh3_64_hexdigest(np.ascontiguousarray(tokens, dtype="<i4").tobytes())


def _full_sync(fd: int) -> None:
    """fsync, and on macOS F_FULLFSYNC (plain fsync there leaves data in the drive cache)."""
    full = getattr(fcntl, "F_FULLFSYNC", None)
    if full is not None:
        try:
            fcntl.fcntl(fd, full)
            return
        except OSError:
            pass
    os.fsync(fd)


def sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view)
        view = view[n:]


CHUNK = 4 << 20


def byte_chunks(a: np.ndarray):
    """``a``'s bytes in C order as pieces of at most ``CHUNK`` bytes, copying nothing
    where rows are contiguous (a KV buffer cut to its offset is strided only across
    heads). Small pieces keep each hash/write call short, so the GIL changes hands and
    the MLX thread is never held up for long."""
    if a.ndim == 0:
        a = a.reshape(1)
    if a.flags.c_contiguous:
        view = memoryview(a.data).cast("B") if a.size else memoryview(b"")
        for i in range(0, len(view), CHUNK):
            yield view[i:i + CHUNK]
    elif a.ndim == 1:
        yield from byte_chunks(np.ascontiguousarray(a))
    else:
        for sub in a:
            yield from byte_chunks(sub)


def _header_bytes(body: dict, table: dict) -> bytes:
    ours = json.dumps(body, separators=(",", ":"))
    meta = {"format": FORMAT, "header": ours, "check": xxhash.xxh64_hexdigest(ours.encode())}
    raw = json.dumps({"__metadata__": meta, **table}, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)


def write_entry(directory: Path, header: dict, tokens: np.ndarray,
                tensors: list, mx_dtypes: list, *, strong: bool = False,
                cancelled: Callable[[], bool] = lambda: False) -> tuple[Path | None, int]:
    """Write one entry atomically into ``directory``; ``(path, size)`` of the new file.

    ``tensors`` are host arrays (numpy views of evaluated MLX arrays, strided or not),
    written in order; ``mx_dtypes`` names the MLX dtype each stands for (bfloat16 bytes
    come as uint16). The temp file is locked while written, so a reaper never removes a
    live one. ``cancelled`` is polled between tensors (then ``(None, 0)``).
    """
    tokens = np.ascontiguousarray(tokens, dtype="<i4")
    table, specs, off = _layout(tokens, tensors, mx_dtypes)
    body = {**header, "format": FORMAT, "version": VERSION, "n_tokens": int(tokens.size),
            "tokens_hash": token_hash(tokens), "tensors": specs, "data_bytes": off,
            "hash": {"xxh3_128": _ZERO_FAST, **({"blake2b": _ZERO_STRONG} if strong else {})}}
    raw = _header_bytes(body, table)
    tmp = directory / f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex}{SUFFIX}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    ok = False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.lseek(fd, _LEN.size + len(raw), os.SEEK_SET)
        hashes = _write_data(fd, tokens, tensors, strong, cancelled)
        if hashes is None:
            return None, 0
        body["hash"].update(hashes)
        final = _header_bytes(body, table)
        assert len(final) == len(raw)
        os.lseek(fd, 0, os.SEEK_SET)
        _write_all(fd, _LEN.pack(len(final)) + final)
        _full_sync(fd)
        path = directory / f"{uuid.uuid4().hex}{SUFFIX}"
        os.rename(tmp, path)
        sync_dir(directory)
        ok = True
        return path, _LEN.size + len(raw) + off
    finally:
        os.close(fd)
        if not ok:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _layout(tokens: np.ndarray, tensors: list,
            mx_dtypes: list) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    """Where the token ids and each tensor lie: the safetensors table, our tensor specs and
    the data bytes in all. A dtype safetensors cannot name is a ValueError."""
    table: dict[str, Any] = {"tokens": {"dtype": "I32", "shape": [int(tokens.size)],
                                        "data_offsets": [0, int(tokens.nbytes)]}}
    specs, off = [], int(tokens.nbytes)
    for i, (t, mx_dtype) in enumerate(zip(tensors, mx_dtypes)):
        if mx_dtype not in ST_DTYPES:
            raise ValueError(f"dtype {mx_dtype} cannot be stored")
        n = int(t.nbytes)
        table[f"t{i}"] = {"dtype": ST_DTYPES[mx_dtype], "shape": [int(x) for x in t.shape],
                          "data_offsets": [off, off + n]}
        specs.append({"mx_dtype": mx_dtype, "shape": [int(x) for x in t.shape], "offset": off,
                      "nbytes": n})
        off += n
    return table, specs, off


def _write_data(fd: int, tokens: np.ndarray, tensors: list, strong: bool,
                cancelled: Callable[[], bool]) -> dict[str, str] | None:
    """The token ids, then every tensor's bytes hashed as they are written; the content
    hashes for the header, or None when ``cancelled`` (polled between tensors)."""
    fast = xxhash.xxh3_128()
    slow = hashlib.blake2b(digest_size=32) if strong else None
    _write_all(fd, tokens)
    for t in tensors:
        if cancelled():
            return None
        for chunk in byte_chunks(t):
            fast.update(chunk)
            if slow is not None:
                slow.update(chunk)
            _write_all(fd, chunk)
    hashes = {"xxh3_128": fast.hexdigest()}
    if slow is not None:
        hashes["blake2b"] = slow.hexdigest()
    return hashes


@dataclass
class EntryHeader:
    path: Path
    header: dict
    tokens: np.ndarray
    data_start: int
    size: int

    @property
    def tensors(self) -> list[TensorSpec]:
        return [TensorSpec(t["mx_dtype"], tuple(t["shape"]), int(t["offset"]), int(t["nbytes"]))
                for t in self.header["tensors"]]


def _read_exact(f, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise CorruptEntry("truncated")
    return data


def read_header(path: Path, f=None) -> EntryHeader:
    """The checked header and token ids of ``path`` (reads no tensor bytes)."""
    own = f is None
    if own:
        f = open(path, "rb", buffering=0)  # noqa: SIM115 (closed in the finally below)
    try:
        size = os.fstat(f.fileno()).st_size
        (hlen,) = _LEN.unpack(_read_exact(f, _LEN.size))
        if not 0 < hlen <= MAX_HEADER:
            raise CorruptEntry("not an mlxbun KV file (header length out of range)")
        try:
            table = json.loads(_read_exact(f, hlen))
            meta = table.pop("__metadata__")
            ours = meta["header"]
        except (ValueError, KeyError, TypeError):
            raise CorruptEntry("not an mlxbun KV file") from None
        check = xxhash.xxh64_hexdigest(ours.encode())
        if meta.get("format") != FORMAT or check != meta.get("check"):
            raise CorruptEntry("header hash mismatch")
        header = json.loads(ours)
        if header.get("version") != VERSION:
            raise CorruptEntry(f"format version {header.get('version')} "
                               f"(this build reads {VERSION})")
        start = _LEN.size + hlen
        if size != start + int(header["data_bytes"]):
            raise CorruptEntry(f"size {size}, header says {start + header['data_bytes']}")
        _check_table(table, header)
        n = int(header["n_tokens"])
        f.seek(start)
        tokens = np.frombuffer(_read_exact(f, 4 * n), dtype="<i4").astype(np.int32)
        if token_hash(tokens) != header["tokens_hash"]:
            raise CorruptEntry("token hash mismatch")
        return EntryHeader(Path(path), header, tokens, start, size)
    except (KeyError, TypeError, ValueError, struct.error) as exc:
        raise CorruptEntry(f"malformed header: {exc}") from None
    finally:
        if own:
            f.close()


def _check_table(table: dict[str, Any], header: dict[str, Any]) -> None:
    """The safetensors table (what ``mx.load`` will read) must say what ours says."""
    n = int(header["n_tokens"])
    want: dict[str, list[Any]] = {"tokens": ["I32", [n], [0, 4 * n]]}
    for i, t in enumerate(header["tensors"]):
        want[f"t{i}"] = [ST_DTYPES.get(t["mx_dtype"]), list(t["shape"]),
                         [t["offset"], t["offset"] + t["nbytes"]]]
    got = {k: [v.get("dtype"), v.get("shape"), v.get("data_offsets")] for k, v in table.items()}
    if got != want:
        raise CorruptEntry("the tensor table does not match the header")


def drop_pages(f) -> None:
    """Tell the OS the file's pages will not be read again (Linux; a no-op elsewhere)."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None:
        with contextlib.suppress(OSError):
            advise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def reap_orphans(directory: Path) -> int:
    """Remove temp files whose writer is gone (its lock is free); live ones stay."""
    removed = 0
    try:
        names = [p for p in directory.iterdir() if p.name.startswith(TMP_PREFIX)]
    except OSError:
        return 0
    for p in names:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a live writer holds it
        try:
            os.unlink(p)
            removed += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


def maybe_remove(path: Path | None) -> None:
    if path is None:
        return
    with contextlib.suppress(OSError):
        os.unlink(path)
