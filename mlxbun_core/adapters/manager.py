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

Two ways to run adapters on the one model: :meth:`AdapterManager.activate` swaps one
set's wrappers onto its layers (every row of the pass runs that set; the serial lane,
a lone stream, a batch whose rows share a set), and :meth:`AdapterManager.route` gives
a batch pass whose rows carry different sets per-row wrappers over stacked factors
(``rows.py``). Sets that cannot run per row (expert LoRA layers), or every set when
mixing is off (``MLXBUN_ADAPTER_MIXING=off``), keep one set per batch: :meth:`group`
tells the batch lane which sets may share a batch.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import fspaths
from ..errors import BadRequest, NotFound
from ..runconfig import current
from . import formats
from .sets import NO_ADAPTERS, AdapterSet, Mounted, next_serial

if TYPE_CHECKING:
    from .rows import Roster, RowRoute

log = logging.getLogger("mlxbun.adapters")

_SPLIT = re.compile(r"[+,]")




class AdapterManager:
    def __init__(self, loaded, *,
                 call: Callable[[Callable[[], Any]], Awaitable[Any]] | None = None,
                 on_bytes: Callable[[int], None] | None = None):
        self.loaded = loaded  # the LoadedModel (id and path for base-model checks)
        self.model = loaded.model  # the mlx.nn.Module the lanes run
        self._call = call  # worker.call
        self._on_bytes = on_bytes  # told the adapter bytes held whenever they change
        self._mounted: dict[str, Mounted] = {}  # replaced whole, never mutated in place
        self._default: str | None = None
        self._base: dict[str, object] = {}  # module path -> the plain module it replaces
        self._active = NO_ADAPTERS  # the set activate() installed (NO_ADAPTERS while mixed)
        self._active_key: str | None = ""  # what the model computes now (a set's key, a roster's)
        self._wrapped: set = set()
        self._lock = threading.Lock()  # mount / unmount bookkeeping
        # rows of different sets may share a batch (MLXBUN_ADAPTER_MIXING, --adapter-mixing)
        self.mixing = current().engine.adapter_mixing
        self._roster: Roster | None = None  # the adapters stacked for per-row routing
        self._roster_key: str | None = None  # _active_key while its wrappers are installed
        self._roster_stale = False  # an adapter in it was unmounted or replaced
        self._route: RowRoute | None = None  # what the per-row wrappers read
        self._routed: tuple = ()  # the set keys the route holds, row by row
        self._passes = {"base": 0, "one_set": 0, "mixed": 0}  # batch passes by routing
        self._sets_last = self._sets_max = self._sets_sum = 0  # distinct sets per pass

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

    def group(self, aset: AdapterSet) -> str:
        """Which batch ``aset`` may run in: ``""`` for the shared batch that every set able
        to run per row joins (the base model too), else the set's own key."""
        if not aset or (self.mixing and all(a.mixable for a in aset.adapters)):
            return ""
        return aset.key

    @property
    def resident_bytes(self) -> int:
        """Adapter arrays held: the mounted factors plus the per-row stacks."""
        roster = self._roster
        return (sum(m.ram_bytes for m in self._mounted.values())
                + (roster.nbytes if roster is not None else 0))

    def stats(self) -> dict:
        """``/stats`` ``batch.adapters``: how batch passes ran and how many sets they mixed."""
        roster, passes = self._roster, self._passes
        total = sum(passes.values())
        return {"mixing": self.mixing, "mounted": len(self._mounted),
                "stacked": len(roster.adapters) if roster is not None else 0,
                "stacked_bytes": roster.nbytes if roster is not None else 0,
                "resident_bytes": self.resident_bytes, "passes": dict(passes),
                "sets_per_pass": {"last": self._sets_last, "max": self._sets_max,
                                  "mean": round(self._sets_sum / total, 3) if total else 0.0}}

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
        self._roster_stale = True  # a replaced adapter of this id leaves the stacks
        self._report_bytes()
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
        self._roster_stale = True  # restacked without it at the next mixed pass
        if self._active_key != self._roster_key:
            self._roster = None  # no per-row wrappers installed: drop the stacks now
        self._report_bytes()
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
        """Make the model compute with ``aset`` for every row (worker thread; cheap when
        unchanged)."""
        if aset.key == self._active_key:
            return
        from .layers import wrap

        want: dict = {}
        for adapter in aset.adapters:
            for path, part in adapter.parts.items():
                want.setdefault(path, []).append(part)
        self._install({path: wrap(self._base_module(path), parts)
                       for path, parts in want.items()})
        if self._active_key == self._roster_key and self._roster_stale:
            self._roster = None  # leaving per-row routing with an outdated stack: free it
            self._report_bytes()
        self._active, self._active_key = aset, aset.key

    def route(self, sets: Sequence[AdapterSet],
              live: Callable[[], Iterable[AdapterSet]] = tuple) -> None:
        """Set up the next batch pass, whose rows run ``sets`` (row order; worker thread).
        One set for all rows is :meth:`activate`; different sets route per row over the
        stacked factors of every adapter the lane's rows use (``live()``: their sets)."""
        key = sets[0].key
        if all(s.key == key for s in sets):
            self._count(1, "one_set" if key else "base")
            return self.activate(sets[0])
        keys = tuple(s.key for s in sets)
        if keys != self._routed or self._active_key != self._roster_key or self._roster_stale:
            self._mix(sets, keys, live)
        self._count(self._sets_last, "mixed")

    def _mix(self, sets: Sequence[AdapterSet], keys: tuple,
             live: Callable[[], Iterable[AdapterSet]]) -> None:
        """Install the per-row wrappers (restacking when an adapter is missing or gone)
        and route them by ``sets``."""
        need = {a for s in sets for a in s.adapters}
        roster = self._roster
        if roster is None or not roster.covers(need) or self._orphaned(roster, live):
            roster = self._restack(need, live)
        assert self._route is not None  # made with the roster
        if self._active_key != self._roster_key:
            self._install(roster.modules(self._base_module, self._route))
            self._active, self._active_key = NO_ADAPTERS, self._roster_key
        roster.fill(self._route, sets, keys)
        self._routed = keys
        self._sets_last = len(set(keys))

    def _count(self, sets: int, kind: str) -> None:
        self._passes[kind] += 1
        if kind != "mixed":
            self._sets_last = 1
        self._sets_max = max(self._sets_max, sets)
        self._sets_sum += sets

    def _orphaned(self, roster: Roster, live: Callable[[], Iterable[AdapterSet]]) -> bool:
        """Whether ``roster`` stacks an adapter that is neither mounted nor used by a row
        (checked only after an unmount or a replacement: ``_roster_stale``)."""
        if not self._roster_stale:
            return False
        mounted = set(self._mounted.values())
        orphans = {a for a in roster.adapters if a not in mounted}
        self._roster_stale = bool(orphans)  # rows still running an unmounted adapter
        return bool(orphans - {a for aset in live() for a in aset.adapters})

    def _restack(self, need: set, live: Callable[[], Iterable[AdapterSet]]) -> Roster:
        """A fresh roster: what this pass needs, what the lane's rows use, and what the
        old roster held that is still mounted."""
        from .rows import Roster, RowRoute

        keep = set(need)
        for aset in live():
            keep.update(aset.adapters)
        mounted = set(self._mounted.values())
        if self._roster is not None:
            keep.update(a for a in self._roster.adapters if a in mounted)
        self._roster = None  # let the old stacks go before the new ones are made
        roster = Roster(sorted((a for a in keep if a.mixable), key=lambda a: a.serial))
        self._roster, self._roster_stale = roster, not keep <= mounted
        self._roster_key = f"\0rows#{next_serial()}"  # never a set's key
        self._route = RowRoute()
        self._report_bytes()
        log.info("per-row LoRA: %d adapters stacked over %d layers, %.1f MB",
                 len(roster.adapters), len(roster.layers), roster.nbytes / 1e6)
        return roster

    def _install(self, modules: dict) -> None:
        """Put ``modules`` (path -> wrapper) in the model; every other wrapped path gets
        its plain layer back."""
        from .layers import set_module

        for path in self._wrapped - modules.keys():
            set_module(self.model, path, self._base[path])
        for path, module in modules.items():
            set_module(self.model, path, module)
        self._wrapped = set(modules)

    def _report_bytes(self) -> None:
        if self._on_bytes is not None:
            self._on_bytes(self.resident_bytes)

    def _base_module(self, path: str):
        """The plain layer at ``path`` (never one of our wrappers)."""
        if path in self._base:
            return self._base[path]
        from .layers import WRAPPERS, get_module
        from .rows import LoRARowsLinear

        module = get_module(self.model, path)
        if isinstance(module, (*WRAPPERS, LoRARowsLinear)):
            module = module.linear
        if module is not None:
            self._base[path] = module
        return module

