"""What the one-shot model verbs (``generate``, ``embed``, ``perplexity``) share: a verb
parser whose positionals may sit on either side of its options (``gen MODEL --raw "text"``),
and the model chosen and resolved as ``serve`` chooses it."""

from __future__ import annotations

import argparse
from typing import Any


class IntermixedParser(argparse.ArgumentParser):
    """Parses positionals and options in any order (argparse's intermixed parsing), also
    when it runs as a subcommand's parser."""

    _inside = False

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if self._inside:  # the intermixed parse calls back in here, twice
            return super().parse_known_args(args, namespace)
        self._inside = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inside = False


def verb_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
                **kw: Any) -> argparse.ArgumentParser:
    """``sub.add_parser(name, **kw)`` made an :class:`IntermixedParser`."""
    p = sub.add_parser(name, **kw)
    p.__class__ = IntermixedParser
    return p
