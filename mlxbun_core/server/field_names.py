"""Error messages in a surface's own field names.

The Anthropic and Responses surfaces translate their bodies into the chat body, so
the shared chat path reports chat names (``max_tokens``, ``stop``,
``response_format``…). :func:`renamed` rewrites such an error's ``param`` and message
into the name the client actually sent.
"""

from __future__ import annotations

import copy
import re

from ..errors import APIError


def renamed(exc: APIError, names: dict[str, str]) -> APIError:
    """``exc`` with chat field names (keys of ``names``, dotted paths allowed) replaced
    by the surface's names; unchanged when its ``param`` is none of them."""
    param = exc.param
    keys = sorted(names, key=len, reverse=True)  # "a.b" before "a"
    hit = next((k for k in keys if param == k or (param or "").startswith(k + ".")), None)
    if hit is None:
        return exc
    message = exc.message
    for k in keys:
        message = re.sub(rf"(?<![\w.]){re.escape(k)}(?!\w)", names[k], message)
    out = copy.copy(exc)
    out.message, out.param, out.args = message, names[hit] + param[len(hit):], (message,)
    return out
