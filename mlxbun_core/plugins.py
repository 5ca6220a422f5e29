"""Finding plugins, and routing per-model hooks to the plugin that claimed the model.

One pluggy ``PluginManager`` for the process. Built-in plugins register through
the same hooks as installed ones; installed ones come from the ``mlxbun``
entry-point group. ``MLXBUN_PLUGINS`` (comma-separated names) is an allowlist of
installed plugins, ``MLXBUN_DISABLE_PLUGINS`` a blocklist of any (``webapp``: a server
of the inference APIs alone). A plugin that fails to import is reported
and skipped, never fatal. ``MLXBUN_TRACE_HOOKS=1`` logs every hook call, which
plugins it went to, and what it answered.

Routing (see :mod:`mlxbun_core.hookspecs`): :func:`model_hooks` gives a model's
relay, a stand-in for ``hook()`` whose callers leave out every family plugin but
the claiming one and ``generic``.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any

import pluggy

from . import hookspecs
from .hookspecs import FAMILY_HOOKS, GENERIC
from .model import LoadedModel
from .runconfig import settled

log = logging.getLogger("mlxbun.plugins")

ENTRY_POINT_GROUP = "mlxbun"
BUILTIN_PLUGINS = (
    "mlxbun_core.plugins_builtin.generic",
    "mlxbun_core.plugins_builtin.draft_model",
    "mlxbun_core.plugins_builtin.llguidance_backend",
    "mlxbun_core.plugins_builtin.xgrammar_backend",
    "mlxbun_core.server.api",  # the inference APIs' routes
    "mlxbun_core.webapp",  # the web app: its routes and verbs
)


class PluginError(Exception):
    """A plugin broke the contract (claimed a family nobody provides, claimed a
    checkpoint and then did not load it)."""


class _Manager(pluggy.PluginManager):
    """Counts registrations, so relays and the family index notice plugins that
    come and go after a model was loaded."""

    generation = 0

    def register(self, plugin: object, name: str | None = None) -> str | None:
        try:
            return super().register(plugin, name)
        finally:
            self.generation += 1

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any:
        try:
            return super().unregister(plugin, name)
        finally:
            self.generation += 1


pm = _Manager("mlxbun")
pm.add_hookspecs(hookspecs)

# name -> {"version": str|None, "source": "builtin"|"entry point"|"runtime", "error": str|None}
plugin_info: dict[str, dict[str, Any]] = {}
_loaded = False


def _wanted(name: str) -> bool:
    wanted = settled().process
    return name not in wanted.disable_plugins and (wanted.plugins is None
                                                   or name in wanted.plugins)


def load_plugins() -> pluggy.PluginManager:
    """Register built-ins and installed plugins once per process."""
    global _loaded
    if _loaded:
        return pm
    _loaded = True
    for modname in BUILTIN_PLUGINS:
        name = modname.rsplit(".", 1)[-1]
        if name in settled().process.disable_plugins:
            continue  # a built-in can be blocked too (the web app); the allowlist is not for them
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name and modname.startswith(exc.name):
                continue  # optional built-in not present in this tree
            raise
        if getattr(mod, "AVAILABLE", True) is False:
            continue
        pm.register(mod, name=name)
        plugin_info[name] = {"version": None, "source": "builtin", "error": None}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if not _wanted(ep.name):
            continue
        dist = getattr(ep, "dist", None)
        info = {"version": dist.version if dist else None, "source": "entry point",
                "distribution": dist.name if dist else None, "error": None}
        try:
            pm.register(ep.load(), name=ep.name)
        except Exception as exc:  # a broken plugin must not take the server down
            info["error"] = f"{type(exc).__name__}: {exc}"
            log.warning("plugin %s failed to load and was skipped: %s", ep.name, info["error"])
        else:
            _check_family(ep.name)
        plugin_info[ep.name] = info
    if settled().process.trace_hooks:
        trace_hooks()
    return pm


def trace_hooks() -> None:
    """Log every hook call: the plugins asked, in order, and the answer."""

    def after(outcome: pluggy.Result[object], name: str, impls: Sequence[pluggy.HookImpl],
              kwargs: Mapping[str, object]) -> None:
        order = [i.plugin_name for i in reversed(impls)]  # the order they are asked in
        if outcome.exception is not None:
            log.info("hook %s %s raised %r", name, order, outcome.exception)
        else:
            log.info("hook %s %s -> %s", name, order, _short(outcome.get_result()))

    pm.add_hookcall_monitoring(lambda name, impls, kwargs: None, after)


def _short(value: object) -> str:
    if value is None or isinstance(value, (str, int, float, bool)):
        return repr(value)
    if isinstance(value, list):
        return f"[{len(value)} answers]"
    return type(value).__name__


def hook() -> pluggy.HookRelay:
    """The unrouted hook caller, for hooks that are not about one model
    (``claims``, ``register_grammar_backends``). Per-model hooks go through
    :func:`model_hooks`."""
    return load_plugins().hook


def register(plugin: object, name: str) -> None:
    """Register a plugin object at run time (tests, embedding applications)."""
    load_plugins()
    pm.register(plugin, name=name)
    plugin_info[name] = {"version": None, "source": "runtime", "error": None}
    _check_family(name)


def unregister(name: str) -> None:
    pm.unregister(name=name)
    plugin_info.pop(name, None)


# -- families -------------------------------------------------------------------

_index: dict[str, Any] = {"generation": -1, "family_of": {}, "provider": {}}


def _family_index() -> dict[str, Any]:
    """``{"family_of": {plugin: family}, "provider": {family: plugin}}`` for the
    registered plugins; rebuilt (and swapped in whole) when plugins change."""
    global _index
    if _index["generation"] == pm.generation:
        return _index
    generation = pm.generation
    family_of: dict[Any, str] = {}
    for hookname in sorted(FAMILY_HOOKS):
        for impl in getattr(pm.hook, hookname).get_hookimpls():
            if not (impl.wrapper or impl.hookwrapper):
                family_of.setdefault(impl.plugin, family_name(impl.plugin))
    provider: dict[str, Any] = {}
    for impl in reversed(pm.hook.claims.get_hookimpls()):  # priority order: first wins
        fam = family_of.get(impl.plugin)
        if fam is None:
            continue
        if fam in provider and provider[fam] is not impl.plugin:
            log.warning("plugins %s and %s both provide family %r; %s wins",
                        pm.get_name(provider[fam]), impl.plugin_name, fam,
                        pm.get_name(provider[fam]))
            continue
        provider[fam] = impl.plugin
    _index = {"generation": generation, "family_of": family_of, "provider": provider}
    return _index


def family_name(plugin: object) -> str:
    """The family a plugin provides: its ``FAMILY`` attribute, else its registered name."""
    return getattr(plugin, "FAMILY", None) or pm.get_name(plugin) or "?"


def is_family(plugin: object) -> bool:
    """Whether ``plugin`` has a plain implementation of any of :data:`FAMILY_HOOKS`."""
    return plugin in _family_index()["family_of"]


def family_provider(family: str) -> str | None:
    """The registered name of the plugin that provides ``family``, or None."""
    plugin = _family_index()["provider"].get(family)
    return pm.get_name(plugin) if plugin is not None else None


def _check_family(name: str) -> None:
    plugin = pm.get_plugin(name)
    if plugin is None or not is_family(plugin):
        return
    if not any(i.plugin is plugin and not (i.wrapper or i.hookwrapper)
               for i in pm.hook.claims.get_hookimpls()):
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [] if h.name in FAMILY_HOOKS)
        log.warning("plugin %s implements %s but not claims: it is a model family that never "
                    "claims a checkpoint, so it is never asked", name, ", ".join(hooks))


# -- per-model relay ------------------------------------------------------------

CLAIMANT_ONLY = frozenset({"load_model"})
"""Hooks the generic fallback is not asked on another family's behalf."""


class ModelHooks:
    """The hook relay for models claimed by one plugin.

    ``relay.<hook>`` is a pluggy ``HookCaller`` (call it with keyword arguments, as
    ``hook().<hook>``) that leaves out every family plugin except the claimant and
    ``generic``; extension plugins and wrappers stay. Callers are built on first use
    and rebuilt only when plugins are registered or unregistered.
    """

    def __init__(self, claimant: str | None):
        self.claimant = claimant
        self._callers: dict[str, pluggy.HookCaller] = {}
        self._generation = -1

    def __getattr__(self, name: str) -> pluggy.HookCaller:
        if name.startswith("_"):
            raise AttributeError(name)
        if self._generation != pm.generation:
            self._callers.clear()
            self._generation = pm.generation
        caller = self._callers.get(name)
        if caller is None:
            caller = self._callers[name] = pm.subset_hook_caller(name, self._foreign(name))
        return caller

    def _foreign(self, name: str) -> list[object]:
        keep = {pm.get_plugin(self.claimant) if self.claimant else None}
        if name not in CLAIMANT_ONLY or self.claimant is None:
            keep.add(_family_index()["provider"].get(GENERIC))
        return [p for p in _family_index()["family_of"] if p not in keep]

    def __repr__(self) -> str:
        return f"<ModelHooks claimant={self.claimant!r}>"


_relays: dict[str | None, ModelHooks] = {}


def relay_for(plugin_name: str | None) -> ModelHooks:
    """The relay for models claimed by the plugin registered as ``plugin_name``."""
    load_plugins()
    relay = _relays.get(plugin_name)
    if relay is None:
        relay = _relays[plugin_name] = ModelHooks(plugin_name)
    return relay


def model_hooks(model: LoadedModel) -> ModelHooks:
    """The relay for a loaded model: ``model_hooks(model).render_chat(model=model, ...)``.

    The claimant is ``model.plugin`` (set by the loader), or for a model built by
    hand the plugin providing ``model.family``. Relays are kept per claimant
    (:func:`relay_for`), so nothing is cached on the model itself.
    """
    return relay_for(model.plugin or family_provider(model.family))


LoadedModel.relay_for = model_hooks  # ``model.hooks`` asks here; the record imports nothing


def describe() -> list[dict[str, Any]]:
    """One row per plugin: name, version, source, family (or None for an
    extension), hooks implemented, load error."""
    load_plugins()
    rows = []
    for name, info in plugin_info.items():
        plugin = pm.get_plugin(name)
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or []) if plugin else []
        family = family_name(plugin) if plugin is not None and is_family(plugin) else None
        rows.append({"name": name, **info, "family": family, "hooks": hooks})
    return rows
