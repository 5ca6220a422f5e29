"""Structured output (grammar-constrained decoding).

Server/engine entry points: ``registry.plan(body, tokenizer, prompt_len=None)`` ->
:class:`GrammarPlan` (raises BadRequest for ill-typed fields); ``registry.select(name)``
for ``--grammar-backend``; ``registry.stats()`` for /stats. Backends are plugins
(hook ``register_grammar_backends``); llguidance (default) and xgrammar ship built in.

``guided_grammar`` dialects: both backends take GBNF-style EBNF (``root ::= ...``,
llama.cpp / xgrammar syntax) and Lark (``start: ...``). Regex ``\\d``/``\\w`` are ASCII
on both. json_object means "a JSON object" (OpenAI semantics) on both.

Added tokens: text that spells an added token (Qwen's ``<tool_call>``, Gemma's
``<|tool_call>``) may be produced by that single token on both backends; on llguidance
a *special* token's text in regex / choice / EBNF is produced only by the token, and in
JSON strings only as text (see ``llg_special``).
"""

from .base import (CompiledGrammar, GrammarBackend, GrammarCompileError, GrammarPlan,
                   GrammarProcessor, GrammarRegistry, make_processor, registry)
from .request import GrammarRequest, budget_close, describe, resolve_grammar_request

__all__ = ["CompiledGrammar", "GrammarBackend", "GrammarCompileError", "GrammarPlan",
           "GrammarProcessor", "GrammarRegistry", "GrammarRequest", "budget_close", "describe",
           "make_processor", "registry", "resolve_grammar_request"]
