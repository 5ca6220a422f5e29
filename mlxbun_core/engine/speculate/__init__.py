"""Speculative decoding by prompt lookup (``--draft-kind ngram``, per request ``draft_kind``).

``lookup``: the n-gram index that proposes drafts; ``stream``: one stream's verify loop
(lone-stream and serial paths); ``config``: the server flag and the request field.
"""

from .config import SpecConfig, SpecRequest, resolve, server_config, speculation_field
from .lookup import PromptLookup
from .stream import SpecStream, SpecTally, rewindable, spec_steps, trim_to

__all__ = ["PromptLookup", "SpecConfig", "SpecRequest", "SpecStream", "SpecTally", "resolve",
           "rewindable", "server_config", "spec_steps", "speculation_field", "trim_to"]
