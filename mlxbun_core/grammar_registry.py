"""The grammar registry: which structured-output backends are installed, which one is
selected, an LRU of compiled grammars, and the degrade path when a constraint cannot be
enforced.

Backends are plugins (hook ``register_grammar_backends``; llguidance, the default, and
xgrammar ship in :mod:`mlxbun_core.plugins_builtin`), so this module sits above the
plugin machinery; :mod:`mlxbun_core.grammar` below it is the backend-free part (request
fields, the mask processor, the budget close). Entry points: ``registry.plan(body,
tokenizer)`` / ``plan_request`` for the engine, ``registry.select(name)`` for
``--grammar-backend``, ``registry.stats()`` for ``/stats``.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .contract import GrammarBackend
from .grammar.base import CompiledGrammar, GrammarCompileError, GrammarPlan, make_processor
from .grammar.request import GrammarRequest, describe, resolve_grammar_request
from .plugins import hook
from .runconfig import current

log = logging.getLogger("mlxbun.grammar")
DEFAULT_BACKEND = "llguidance"


def grammar_disabled() -> bool:
    """``MLXBUN_GRAMMAR=0``: no grammar is compiled; every constraint degrades."""
    return not current().grammar.enabled


class GrammarRegistry:
    """Registered backends, the selected one, and an LRU of compiled grammars."""

    def __init__(self, cache_size: int = 64, load_plugins: bool = True):
        self.factories: dict[str, Callable[[Any], GrammarBackend]] = {}
        self.chosen: str | None = None  # by select() (None: the config's, see selected)
        self._backends: dict[tuple, tuple] = {}    # (name, id(tok)) -> (tok, backend|exc)
        self._cache: OrderedDict = OrderedDict()
        self.cache_size = cache_size
        self.hits = self.misses = self.degraded = 0
        self._lock = threading.Lock()
        self._want_plugins = load_plugins
        self._loaded = not load_plugins

    def register(self, name: str, factory: Callable[[Any], GrammarBackend]) -> None:
        self.factories[name] = factory

    def _ensure_loaded(self):
        if not self._loaded:
            self._loaded = True
            hook().register_grammar_backends(register=self.register)

    def available(self) -> list[str]:
        self._ensure_loaded()
        return sorted(self.factories)

    def select(self, name: str) -> None:
        """CLI ``--grammar-backend``: fail fast on an unknown/unavailable name."""
        if name not in self.available():
            raise ValueError(f"unknown grammar backend {name!r}; available: "
                             f"{', '.join(self.available()) or 'none'}")
        self.chosen = name

    @property
    def selected(self) -> str:
        return self.chosen or current().grammar.backend or DEFAULT_BACKEND

    def backend_for(self, tokenizer, name: str | None = None) -> GrammarBackend:
        """One backend instance per (backend, tokenizer): building vocab tables is slow."""
        name = name or self.selected
        self._ensure_loaded()
        if name not in self.factories:
            raise GrammarCompileError(f"grammar backend {name!r} is not available")
        key = (name, id(tokenizer))
        entry = self._backends.get(key)
        if entry is None:
            try:
                entry = (tokenizer, self.factories[name](tokenizer))
            except Exception as exc:  # unsupported tokenizer etc.: degrade, don't 500
                entry = (tokenizer, GrammarCompileError(
                    f"{name} cannot use this tokenizer: {type(exc).__name__}: {exc}"))
            self._backends[key] = entry   # holds tok, so id() stays unique
        if isinstance(entry[1], Exception):
            raise entry[1]
        return entry[1]

    def compile(self, req: GrammarRequest, tokenizer, name: str | None = None) -> CompiledGrammar:
        """Cached compile; failures are cached too (and re-raised)."""
        name = name or self.selected
        key = (name, id(tokenizer), req.key)
        with self._lock:
            got = self._cache.get(key)
            if got is not None:
                self._cache.move_to_end(key)
                self.hits += 1
            else:
                self.misses += 1
        if got is None:
            backend = self.backend_for(tokenizer, name)
            try:
                got = backend.compile(req)
            except GrammarCompileError as exc:
                got = exc
            except Exception as exc:
                got = GrammarCompileError(f"{type(exc).__name__}: {exc}")
            with self._lock:
                self._cache[key] = got
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        if isinstance(got, Exception):
            raise got
        return got

    def plan(self, body: dict, tokenizer, prompt_len: int | None = None) -> GrammarPlan:
        """Resolve (400 on ill-typed fields), compile, and build the processor, or the
        degrade plan: no processor, a Warning reason and an instruction text."""
        req = resolve_grammar_request(body)
        if req is None:
            return GrammarPlan()
        return self.plan_request(req, tokenizer, prompt_len)

    def plan_request(self, req: GrammarRequest, tokenizer, prompt_len=None) -> GrammarPlan:
        if grammar_disabled():
            return self.degrade(req, "grammar compilation disabled by MLXBUN_GRAMMAR=0")
        try:
            compiled = self.compile(req, tokenizer)
        except GrammarCompileError as exc:
            return self.degrade(req, str(exc) or "compile failed")
        return GrammarPlan(make_processor(compiled, prompt_len), None, None, req)

    def degrade(self, req: GrammarRequest, reason: str) -> GrammarPlan:
        """No processor: a Warning reason, and ``describe(req)`` to ask for it in words."""
        self.degraded += 1
        # Header-safe: one latin-1 line, bounded.
        reason = " ".join(reason.split())[:300].encode("latin-1", "replace").decode("latin-1")
        log.warning("grammar not enforced (%s): %s", req.kind, reason)
        return GrammarPlan(None, f"grammar not enforced: {reason}", describe(req), req)

    def stats(self) -> dict:
        return {"backend": self.selected, "available": self.available(),
                "compile_cache": {"hits": self.hits, "misses": self.misses,
                                  "size": len(self._cache)},
                "degraded": self.degraded}


registry = GrammarRegistry()
