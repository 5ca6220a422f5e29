"""Finding and loading plugins.

One pluggy ``PluginManager`` for the process. Built-in plugins register through
the same hooks as installed ones; installed ones come from the ``mlxbun``
entry-point group. ``MLXBUN_PLUGINS`` (comma-separated names) is an allowlist,
``MLXBUN_DISABLE_PLUGINS`` a blocklist. A plugin that fails to import is reported
and skipped, never fatal. ``MLXBUN_TRACE_HOOKS=1`` logs every hook call.
"""

from __future__ import annotations

import importlib
import logging
import os
from importlib.metadata import entry_points

import pluggy

from . import hookspecs

log = logging.getLogger("mlxbun.plugins")

ENTRY_POINT_GROUP = "mlxbun"
BUILTIN_PLUGINS = (
    "mlxbun_core.plugins_builtin.generic",
    "mlxbun_core.plugins_builtin.draft_model",
    "mlxbun_core.grammar.llguidance_backend",
    "mlxbun_core.grammar.xgrammar_backend",
)

pm = pluggy.PluginManager("mlxbun")
pm.add_hookspecs(hookspecs)

# name -> {"version": str|None, "source": "builtin"|"entry point", "error": str|None}
plugin_info: dict[str, dict] = {}
_loaded = False


def _names(var: str) -> set[str] | None:
    raw = os.environ.get(var)
    if raw is None:
        return None
    return {n.strip() for n in raw.split(",") if n.strip()}


def _wanted(name: str) -> bool:
    allow, deny = _names("MLXBUN_PLUGINS"), _names("MLXBUN_DISABLE_PLUGINS") or set()
    return name not in deny and (allow is None or name in allow)


def load_plugins() -> pluggy.PluginManager:
    """Register built-ins and installed plugins once per process."""
    global _loaded
    if _loaded:
        return pm
    _loaded = True
    for modname in BUILTIN_PLUGINS:
        name = modname.rsplit(".", 1)[-1]
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
        plugin_info[ep.name] = info
    if os.environ.get("MLXBUN_TRACE_HOOKS"):
        pm.add_hookcall_monitoring(
            lambda name, impls, kw: log.info("hook %s -> %s", name, [i.plugin_name for i in impls]),
            lambda outcome, name, impls, kw: None,
        )
    return pm


def hook():
    """The hook caller (``hook().render_chat(...)``) with plugins loaded."""
    return load_plugins().hook


def register(plugin, name: str) -> None:
    """Register a plugin object at run time (tests, embedding applications)."""
    load_plugins()
    pm.register(plugin, name=name)
    plugin_info[name] = {"version": None, "source": "runtime", "error": None}


def unregister(name: str) -> None:
    pm.unregister(name=name)
    plugin_info.pop(name, None)


def describe() -> list[dict]:
    """One row per plugin: name, version, source, hooks implemented, load error."""
    load_plugins()
    rows = []
    for name, info in plugin_info.items():
        plugin = pm.get_plugin(name)
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or []) if plugin else []
        rows.append({"name": name, **info, "hooks": hooks})
    return rows
