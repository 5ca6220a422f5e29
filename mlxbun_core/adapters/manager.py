"""Mounted LoRA adapters of one engine: mount, unmount, resolve a request's spec,
and activate an adapter set on the model.

Threads: ``mount``/``unmount``/``activate`` run on the model worker (surfaces go
through :meth:`AdapterManager.mount_async`, which queues on ``worker.call``, so no
forward pass ever sees a half-mounted adapter). ``resolve`` and ``rows`` run on the
event loop and read an immutable snapshot of the mounted table.

An :class:`AdapterSet` is resolved when a request starts and travels with its job:
lanes activate the set of the rows they are about to step, the prefix cache keys
KV by ``AdapterSet.key`` (ids *and* mount serials, so a remounted adapter never
reuses old KV), and a request keeps the adapters it started with even if they are
unmounted while it runs.
"""

from __future__ import annotations

import itertools
import logging
import re
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import fspaths
from ..errors import BadRequest, NotFound
from . import formats

log = logging.getLogger("mlxbun.adapters")

_serials = itertools.count(1)
_SPLIT = re.compile(r"[+,]")


@dataclass(eq=False)
class Mounted:
    id: str
    info: formats.AdapterInfo
    parts: dict  # module path -> (a, b, scale)
    serial: int = field(default_factory=lambda: next(_serials))

    @property
    def ram_bytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b, _ in self.parts.values())

    @property
    def rank(self) -> int:
        from .layers import rank_of

        return max(rank_of(a) for a, _, _ in self.parts.values())

    def row(self) -> dict:
        return {"id": self.id, "path": str(self.info.path), "format": self.info.format,
                "rank": self.rank, "scale": self.info.scale, "base_model": self.info.base_model,
                "size_bytes": self.info.size_bytes, "mounted_layers": len(self.parts),
                "ram_bytes": self.ram_bytes}


@dataclass(frozen=True)
class AdapterSet:
    """The adapters one request runs with, in the order their residuals are summed."""

    adapters: tuple = ()

    @property
    def key(self) -> str:
        """Canonical identity: ``""`` for the base model, else ``id#serial`` joined by ``+``."""
        return "+".join(f"{a.id}#{a.serial}" for a in self.adapters)

    @property
    def spec(self) -> str:
        return "+".join(a.id for a in self.adapters) or "none"

    def __bool__(self) -> bool:
        return bool(self.adapters)


NO_ADAPTERS = AdapterSet()


class AdapterManager:
    def __init__(self, loaded, *,
                 call: Callable[[Callable[[], Any]], Awaitable[Any]] | None = None):
        self.loaded = loaded  # the LoadedModel (id and path for base-model checks)
        self.model = loaded.model  # the mlx.nn.Module the lanes run
        self._call = call  # worker.call
        self._mounted: dict[str, Mounted] = {}  # replaced whole, never mutated in place
        self._default: str | None = None
        self._base: dict[str, object] = {}  # module path -> the plain module it replaces
        self._active = NO_ADAPTERS
        self._wrapped: set = set()
        self._lock = threading.Lock()  # mount / unmount bookkeeping

    # -- the event-loop side -------------------------------------------------------
    @property
    def mounted(self) -> dict:
        return self._mounted

    @property
    def default(self) -> str | None:
        return self._default

    def resolve(self, spec: str | None) -> AdapterSet:
        """A request's ``adapter`` field → its AdapterSet; a 400 naming an unknown id.

        ``None`` means the server default (``serve --adapter``), ``"none"`` the base
        model; ``"a+b"`` / ``"a,b"`` stacks mounted adapters in that order.
        """
        mounted = self._mounted
        if spec is None:
            spec = self._default if self._default in mounted else "none"
        spec = spec.strip()
        if spec.lower() in ("", "none"):
            return NO_ADAPTERS
        ids = [s.strip() for s in _SPLIT.split(spec)]
        if any(not s for s in ids):
            raise BadRequest(f"adapter spec {spec!r} has an empty name", param="adapter")
        if len(set(ids)) != len(ids):
            raise BadRequest(f"adapter spec {spec!r} names an adapter twice", param="adapter")
        for s in ids:
            if s not in mounted:
                have = ", ".join(sorted(mounted)) or "none mounted"
                raise BadRequest(f"adapter {s!r} is not mounted (mounted: {have}); "
                                 "mount it with POST /v1/adapters", param="adapter",
                                 code="adapter_not_found")
        return AdapterSet(tuple(mounted[s] for s in ids))

    def rows(self) -> list:
        return [m.row() for m in self._mounted.values()]

    def compatible(self, info: formats.AdapterInfo) -> bool:
        """True when the adapter names no base model or names the one being served
        (compared by bare repo name)."""
        if not info.base_model:
            return True
        return formats.bare_name(info.base_model) in self._served_names()

    def _served_names(self) -> set:
        path = Path(self.loaded.path)
        names = {formats.bare_name(self.loaded.id), path.name.lower()}
        if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
            names.add(path.parent.parent.name.split("--")[-1].lower())  # HF cache layout
        return names

    async def mount_async(self, id: object, path: object, *, force: bool = False) -> Mounted:
        """Validate on the loop, then mount on the worker between decode steps."""
        id, where = self._check_request(id, path)
        return await self._worker()(lambda: self.mount(id, where, force=force))

    async def unmount_async(self, id: str) -> int:
        if id not in self._mounted:
            raise NotFound(f"adapter {id} not mounted")
        return await self._worker()(lambda: self.unmount(id))

    def _worker(self) -> Callable[[Callable[[], Any]], Awaitable[Any]]:
        """``worker.call``: runs a mutation between decode steps."""
        if self._call is None:
            raise RuntimeError("this AdapterManager has no worker to mount on")
        return self._call

    @staticmethod
    def _check_request(id, path) -> tuple[str, Path]:
        if not id or not path:
            raise BadRequest("id and path required")
        return fspaths.check_id(id), fspaths.existing_dir(path, "path")

    # -- the worker side -----------------------------------------------------------
    def mount(self, id: str, path, *, force: bool = False, default: bool = False) -> Mounted:
        """Read, validate and register an adapter; all or nothing (a failure leaves
        the mounted table as it was, including an adapter of the same id)."""
        id, path = self._check_request(id, path)
        info = formats.read_info(path)
        if not force and not self.compatible(info):
            raise BadRequest(f"adapter {id} was trained on {info.base_model!r}, not on the "
                             f"served model {self.loaded.id!r} (send \"force\": true to mount "
                             "it anyway)", param="path", code="adapter_base_mismatch")
        parts = formats.load_tensors(info)
        self._validate(id, parts)
        import mlx.core as mx

        mx.eval([ab for a, b, _ in parts.values() for ab in (a, b)])
        mounted = Mounted(id, info, parts)
        with self._lock:
            self._mounted = {**self._mounted, id: mounted}
            if default:
                self._default = id
        log.info("adapter %s mounted from %s: %d layers, rank %d, %.1f MB", id, path,
                 len(parts), mounted.rank, mounted.ram_bytes / 1e6)
        return mounted

    def unmount(self, id: str) -> int:
        with self._lock:
            mounted = self._mounted.get(id)
            if mounted is None:
                raise NotFound(f"adapter {id} not mounted")
            self._mounted = {k: v for k, v in self._mounted.items() if k != id}
            if self._default == id:
                self._default = None
        if any(a is mounted for a in self._active.adapters):
            self.activate(NO_ADAPTERS)  # lanes re-activate what their rows need next step
        log.info("adapter %s unmounted", id)
        return len(mounted.parts)

    def _validate(self, id: str, parts: dict) -> None:
        from .layers import expected_shapes, rank_of

        errors = []
        for path, (a, b, _) in sorted(parts.items()):
            module = self._base_module(path)
            if module is None:
                errors.append(f"{path}: no such layer in the served model")
                continue
            want = expected_shapes(module, rank_of(a))
            if want is None:
                errors.append(f"{path}: a {type(module).__name__} cannot carry a LoRA")
            elif (tuple(a.shape), tuple(b.shape)) != want:
                errors.append(f"{path}: factors {tuple(a.shape)} x {tuple(b.shape)} do not fit "
                              f"the layer (expected {want[0]} x {want[1]})")
        if errors:
            more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
            raise BadRequest(f"adapter {id} does not fit the served model: "
                             + "; ".join(errors[:5]) + more, param="path",
                             code="adapter_shape_mismatch")

    def activate(self, aset: AdapterSet) -> None:
        """Make the model compute with ``aset`` (worker thread; cheap when unchanged)."""
        if aset.key == self._active.key:
            return
        from .layers import wrap

        want: dict = {}
        for adapter in aset.adapters:
            for path, part in adapter.parts.items():
                want.setdefault(path, []).append(part)
        for path in self._wrapped - want.keys():
            _set_module(self.model, path, self._base[path])
        for path, parts in want.items():
            _set_module(self.model, path, wrap(self._base_module(path), parts))
        self._wrapped = set(want)
        self._active = aset

    def _base_module(self, path: str):
        """The plain layer at ``path`` (never one of our wrappers)."""
        if path in self._base:
            return self._base[path]
        from .layers import WRAPPERS

        module = _get_module(self.model, path)
        if isinstance(module, WRAPPERS):
            module = module.linear
        if module is not None:
            self._base[path] = module
        return module


def _walk(root, path: str):
    obj = root
    for name in path.split(".") if path else ():
        if isinstance(obj, (list, tuple)):
            if not name.isdigit() or int(name) >= len(obj):
                return None
            obj = obj[int(name)]
        elif isinstance(obj, dict) and name in obj:
            obj = obj[name]
        else:
            return None
    return obj


def _get_module(root, path: str):
    import mlx.nn as nn

    obj = _walk(root, path)
    return obj if isinstance(obj, nn.Module) else None


def _set_module(root, path: str, module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = _walk(root, parent_path)
    if isinstance(parent, list):
        parent[int(name)] = module
    else:
        parent[name] = module
