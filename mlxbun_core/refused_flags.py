"""Reference flags with no counterpart here: parsed, then refused with the reason.

argparse alone would answer "unrecognized arguments", which says nothing about why; a flag
that would do nothing is never silently accepted either (issue #37's rule). These stay out
of ``--help`` (it lists what works) and exit 2 the moment they are parsed.
"""

from __future__ import annotations

import argparse
from typing import Any


class RefusedFlag(argparse.Action):
    """``parser.add_argument("--x", action=RefusedFlag, reason="...")``: exit 2 with
    ``mlxbun: --x: reason``. ``nargs`` as argparse's (0 for a switch, the default)."""

    def __init__(self, option_strings: list[str], dest: str, reason: str = "",
                 nargs: Any = 0, **kwargs: Any) -> None:
        kwargs.pop("help", None)
        super().__init__(option_strings, dest, nargs=nargs, help=argparse.SUPPRESS, **kwargs)
        self.reason = reason

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        parser.exit(2, f"mlxbun: {option_string}: refused: {self.reason}\n")


def refuse(parser: argparse.ArgumentParser, *flags: str, reason: str, takes_value: bool = False
           ) -> None:
    """Add ``flags`` to ``parser`` as one refused flag (``takes_value``: it has an argument)."""
    parser.add_argument(*flags, action=RefusedFlag, reason=reason,
                        nargs=1 if takes_value else 0, dest=argparse.SUPPRESS)
