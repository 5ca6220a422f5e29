"""Speculative decoding by prompt lookup (``--draft-kind ngram``) or the model's own
multi-token-prediction head (``--draft-kind mtp``); per request ``draft_kind``.

``lookup``: the n-gram index that proposes drafts; ``stream``: one stream's verify loop
(lone-stream and serial paths); ``guided``: that loop for a request that also fills
(forced runs and drafts in one window); ``batch``: lookup on the batch lane; ``mtp``: the MTP
head's loop (serial lane, a lone request); ``mtp_batch``: MTP rows on the batch lane
(the executor's tap: their heads read the batch's hidden states and draft on the
device), with ``mtp_head`` (the heads' KV, paged); ``config``: the server flag and the
request field.
"""

from .config import (
           MTP,
           SpecConfig,
           SpecRequest,
           SpecUnavailable,
           check_mtp,
           resolve,
           server_config,
           speculation_field,
)
from .guided import GuidedStream
from .lookup import PromptLookup
from .mtp import HeadState, MtpStream
from .stream import SpecStream, SpecTally, rewindable, spec_steps, trim_to

__all__ = ["MTP", "GuidedStream", "HeadState", "MtpStream", "PromptLookup", "SpecConfig",
           "SpecRequest", "SpecStream", "SpecTally", "SpecUnavailable", "check_mtp", "resolve",
           "rewindable", "server_config", "spec_steps", "speculation_field",
           "trim_to"]
