"""``keep_alive`` as Ollama users write it: how long a model stays loaded after a reply.

A number is seconds; a string is a number of seconds or a Go-style duration
(``"30s"``, ``"5m"``, ``"1h30m"``, ``"250ms"``); ``0`` unloads right after the reply and
any negative value keeps the model loaded for good (``math.inf`` here).
"""

from __future__ import annotations

import argparse
import math
import re

FOREVER = math.inf
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h))+")


def parse_keep_alive(value: object) -> float:
    """Seconds to stay loaded (``math.inf``: forever); ``ValueError`` says what is wrong."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError("keep_alive must be a duration such as \"5m\", a number of "
                         "seconds, 0 (unload after the reply) or -1 (keep loaded)")
    if isinstance(value, str):
        text = value.strip().lower()
        try:
            return _seconds(float(text))
        except ValueError:
            pass
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        if not body or not _WHOLE.fullmatch(body):
            raise ValueError(f"keep_alive {value!r} is not a duration (use e.g. \"30s\", "
                             "\"5m\", \"1h30m\", a number of seconds, 0 or -1)") from None
        total = sum(float(n) * _UNITS[u] for n, u in _PART.findall(body))
        return _seconds(sign * total)
    return _seconds(float(value))


def _seconds(value: float) -> float:
    if math.isnan(value):
        raise ValueError("keep_alive must be a number, not NaN")
    return FOREVER if value < 0 else value


def keep_alive_arg(text: str) -> float:
    """``--keep-alive``'s argparse type."""
    try:
        return parse_keep_alive(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def describe(seconds: float) -> str:
    """How ``config show`` and ``/v1/models`` say a keep-alive."""
    if seconds == FOREVER:
        return "forever"
    return f"{seconds:g}s"
