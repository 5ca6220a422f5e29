"""Structured output (grammar-constrained decoding), backend-free.

The request fields (:mod:`.request`), what a backend compiles to and the mask processor
(:mod:`.base`), the budget-aware close (:mod:`.budget`) and the structural formats of
tool-call markup (:mod:`.structural`). This package knows no plugin: the backends are
built-in plugins (:mod:`mlxbun_core.plugins_builtin.llguidance_backend`, the default,
and ``xgrammar_backend``), and :mod:`mlxbun_core.grammar_registry` picks one, caches
compiled grammars and plans a request (``registry.plan(body, tokenizer)`` ->
:class:`GrammarPlan`, a 400 for ill-typed fields).

``guided_grammar`` dialects: both backends take GBNF-style EBNF (``root ::= ...``,
llama.cpp / xgrammar syntax) and Lark (``start: ...``). Regex ``\\d``/``\\w`` are ASCII
on both. json_object means "a JSON object" (OpenAI semantics) on both.

Added tokens: text that spells an added token (Qwen's ``<tool_call>``, Gemma's
``<|tool_call>``) may be produced by that single token on both backends; on llguidance
a *special* token's text in regex / choice / EBNF is produced only by the token, and in
JSON strings only as text (see ``llg_special``).
"""

from .base import (
                   CompiledGrammar,
                   GrammarCompileError,
                   GrammarPlan,
                   GrammarProcessor,
                   Matcher,
                   make_processor,
)
from .request import GrammarRequest, budget_close, describe, resolve_grammar_request

__all__ = ["CompiledGrammar", "GrammarCompileError", "GrammarPlan", "GrammarProcessor",
           "GrammarRequest", "Matcher", "budget_close", "describe", "make_processor",
           "resolve_grammar_request"]
