"""The on-disk entry: a checked header, the token ids, then raw tensor bytes.

::

    offset 0   b"MLXBUNKV"  u32 version  u32 header length  u64 xxh64(header)
    offset 24  header (UTF-8 JSON)
    aligned    token ids (int32, little-endian)
    aligned    tensor 0, tensor 1, ...   (each at a 4 KiB-aligned offset)

Offsets in the header are relative to the data start (the first aligned offset
after the header), so the header can be sized before any data exists. Hashes
have a fixed width: the writer streams tensors to disk while hashing them and
patches the real digests into the header last. A reader checks the magic, the
header hash, the file size and the token hash before trusting anything, and the
content hash of every tensor byte as it streams them; :class:`CorruptEntry`
means "remove this file and treat it as a miss".

Files appear only by ``rename`` after ``fsync``, so a reader never sees a torn
file under its final name; a crash leaves at most a ``.tmp-*`` file, which the
next start reaps.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np
import xxhash

MAGIC = b"MLXBUNKV"
VERSION = 1
SUFFIX = ".mlxkv"
TMP_PREFIX = ".tmp-"
ALIGN = 4096
_PREFIX = struct.Struct("<8sIIQ")  # magic, version, header length, header hash
MAX_HEADER = 64 << 20
_ZERO_FAST = "0" * 32  # xxh3_128 hex
_ZERO_STRONG = "0" * 64  # blake2b-256 hex


class CorruptEntry(Exception):
    """A file that must not be served: torn, truncated, bit-flipped or foreign."""


@dataclass
class TensorSpec:
    dtype: str  # numpy dtype name of the stored bytes ("uint16" for bfloat16)
    mx_dtype: str  # the MLX dtype to view them as
    shape: tuple
    offset: int
    nbytes: int


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


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


def write_entry(directory: Path, header: dict, tokens: np.ndarray,
                tensors: list, mx_dtypes: list, *, strong: bool = False,
                cancelled: Callable[[], bool] = lambda: False) -> tuple[Optional[Path], int]:
    """Write one entry atomically into ``directory``; ``(path, size)`` of the new file.

    ``tensors`` are host arrays (numpy views of evaluated MLX arrays, strided or not),
    written in order; ``mx_dtypes`` names the MLX dtype each is read back as.
    The temp file is locked while written, so a reaper never removes a live one.
    ``cancelled`` is polled between tensors (the write is then abandoned: ``(None, 0)``).
    """
    tokens = np.ascontiguousarray(tokens, dtype="<i4")
    specs, off = [], align(tokens.nbytes)
    for t, mx_dtype in zip(tensors, mx_dtypes):
        specs.append({"dtype": t.dtype.name, "mx_dtype": mx_dtype, "shape": list(t.shape),
                      "offset": off, "nbytes": int(t.nbytes)})
        off = align(off + int(t.nbytes))
    body = {**header, "n_tokens": int(tokens.size), "tokens_hash": token_hash(tokens),
            "tensors": specs, "data_bytes": off,
            "hash": {"xxh3_128": _ZERO_FAST, **({"blake2b": _ZERO_STRONG} if strong else {})}}
    raw = json.dumps(body, separators=(",", ":")).encode()
    start = align(_PREFIX.size + len(raw))
    tmp = directory / f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex}{SUFFIX}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    ok = False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        fast = xxhash.xxh3_128()
        slow = hashlib.blake2b(digest_size=32) if strong else None
        os.lseek(fd, start, os.SEEK_SET)
        _write_all(fd, tokens)
        pos = tokens.nbytes
        for spec, t in zip(specs, tensors):
            if cancelled():
                return None, 0
            if spec["offset"] > pos:
                os.lseek(fd, start + spec["offset"], os.SEEK_SET)
            data = np.ascontiguousarray(t)
            fast.update(data)
            if slow is not None:
                slow.update(data)
            _write_all(fd, data)
            pos = spec["offset"] + spec["nbytes"]
            del data
        size = start + off
        os.ftruncate(fd, size)  # the trailing alignment pad of the last tensor
        body["hash"]["xxh3_128"] = fast.hexdigest()
        if slow is not None:
            body["hash"]["blake2b"] = slow.hexdigest()
        final = json.dumps(body, separators=(",", ":")).encode()
        assert len(final) == len(raw)
        os.lseek(fd, 0, os.SEEK_SET)
        _write_all(fd, _PREFIX.pack(MAGIC, VERSION, len(final), xxhash.xxh64_intdigest(final)))
        _write_all(fd, final)
        _full_sync(fd)
        path = directory / f"{uuid.uuid4().hex}{SUFFIX}"
        os.rename(tmp, path)
        sync_dir(directory)
        ok = True
        return path, size
    finally:
        os.close(fd)
        if not ok:
            try:
                os.unlink(tmp)
            except OSError:
                pass


@dataclass
class EntryHeader:
    path: Path
    header: dict
    tokens: np.ndarray
    data_start: int
    size: int

    @property
    def tensors(self) -> list[TensorSpec]:
        return [TensorSpec(t["dtype"], t.get("mx_dtype", t["dtype"]), tuple(t["shape"]),
                           int(t["offset"]), int(t["nbytes"])) for t in self.header["tensors"]]


def _read_exact(f, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise CorruptEntry("truncated")
    return data


def read_header(path: Path, f=None) -> EntryHeader:
    """The checked header and token ids of ``path`` (reads no tensor bytes)."""
    own = f is None
    if own:
        f = open(path, "rb", buffering=0)
    try:
        size = os.fstat(f.fileno()).st_size
        magic, version, hlen, hhash = _PREFIX.unpack(_read_exact(f, _PREFIX.size))
        if magic != MAGIC:
            raise CorruptEntry("not an mlxbun KV file")
        if version != VERSION:
            raise CorruptEntry(f"format version {version} (this build reads {VERSION})")
        if not 0 < hlen <= MAX_HEADER:
            raise CorruptEntry("header length out of range")
        raw = _read_exact(f, hlen)
        if xxhash.xxh64_intdigest(raw) != hhash:
            raise CorruptEntry("header hash mismatch")
        try:
            header = json.loads(raw)
        except ValueError as exc:
            raise CorruptEntry(f"header is not JSON: {exc}") from None
        start = align(_PREFIX.size + hlen)
        if size != start + int(header.get("data_bytes", -1)):
            raise CorruptEntry(f"size {size}, header says {start + header.get('data_bytes', 0)}")
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


def stream_tensors(f, entry: EntryHeader, *, strong: bool = False) -> Iterator[np.ndarray]:
    """Each tensor of ``entry`` as a fresh host array, in order, read from the open file
    ``f``; after the last one the content hash is checked (CorruptEntry on a mismatch:
    the caller must drop everything it built from this stream)."""
    fast = xxhash.xxh3_128()
    want_strong = entry.header["hash"].get("blake2b") if strong else None
    slow = hashlib.blake2b(digest_size=32) if want_strong else None
    for spec in entry.tensors:
        try:
            buf = np.empty(spec.shape, dtype=np.dtype(spec.dtype))
        except TypeError as exc:
            raise CorruptEntry(f"bad tensor spec: {exc}") from None
        if buf.nbytes != spec.nbytes:
            raise CorruptEntry("tensor size does not match its shape")
        f.seek(entry.data_start + spec.offset)
        view = memoryview(buf).cast("B")
        got = 0
        while got < spec.nbytes:
            n = f.readinto(view[got:])
            if not n:
                raise CorruptEntry("truncated tensor")
            got += n
        fast.update(view)
        if slow is not None:
            slow.update(view)
        yield buf
    if fast.hexdigest() != entry.header["hash"]["xxh3_128"]:
        raise CorruptEntry("content hash mismatch")
    if slow is not None and slow.hexdigest() != want_strong:
        raise CorruptEntry("blake2b mismatch")


def drop_pages(f) -> None:
    """Tell the OS the file's pages will not be read again (Linux; a no-op elsewhere)."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None:
        try:
            advise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


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


def maybe_remove(path: Optional[Path]) -> None:
    if path is None:
        return
    try:
        os.unlink(path)
    except OSError:
        pass
