"""Structured output (grammar-constrained decoding).

Server/engine entry points: ``registry.plan(body, tokenizer, prompt_len)`` ->
:class:`GrammarPlan`; ``registry.select(name)`` for ``--grammar-backend``;
``registry.stats()`` for /stats. Backends are plugins (hook
``register_grammar_backends``); llguidance and xgrammar ship built in.
"""

from .base import (CompiledGrammar, GrammarBackend, GrammarCompileError, GrammarPlan,
                   GrammarProcessor, GrammarRegistry, make_processor, registry)
from .request import GrammarRequest, describe, resolve_grammar_request

__all__ = ["CompiledGrammar", "GrammarBackend", "GrammarCompileError", "GrammarPlan",
           "GrammarProcessor", "GrammarRegistry", "GrammarRequest", "describe",
           "make_processor", "registry", "resolve_grammar_request"]
