"""The keys a config file's ``serve:`` section may hold, read off ``mlxbun serve``'s own
argparse parser (so a new flag is a new key, with its type, choices and checks, and the
two never drift apart), and the conversion of a YAML value into what the flag would give.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

# serve's arguments that are no setting: the positional (``model:`` is the key), the
# engine half of --isolate, and the config file itself
NOT_KEYS = {"help", "positional", "unix", "config_file"}


@dataclass(frozen=True)
class Option:
    """One ``serve`` flag as a config key."""

    key: str  # the argparse dest: what ``args`` holds and the file's key
    flag: str  # its long spelling, for messages
    action: argparse.Action

    @property
    def kind(self) -> str:
        """``bool``, ``list`` or ``value``."""
        if isinstance(self.action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            return "bool"
        if isinstance(self.action, argparse._AppendAction):
            return "list"
        return "value"


def serve_subparser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``serve`` subcommand's parser inside the whole command line's."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub: argparse.ArgumentParser = action.choices["serve"]
            return sub
    raise KeyError("serve")


def serve_options(parser: argparse.ArgumentParser) -> dict[str, Option]:
    """Every config key, by dest; a flag's long spelling with underscores is an alias."""
    out: dict[str, Option] = {}
    for action in serve_subparser(parser)._actions:
        if action.dest in NOT_KEYS or action.dest is argparse.SUPPRESS:
            continue
        longs = [s for s in action.option_strings if s.startswith("--")]
        if not longs:
            continue
        out[action.dest] = Option(action.dest, longs[0], action)
    return out


def key_aliases(options: dict[str, Option]) -> dict[str, str]:
    """Spellings a file may use for each key: the dest, and every long flag name with
    dashes or underscores (``kv-quant``, ``kv_quant``, ``adapter_path``)."""
    out: dict[str, str] = {}
    for key, opt in options.items():
        out[key] = key
        out[key.replace("_", "-")] = key
        for s in opt.action.option_strings:
            if s.startswith("--"):
                out[s[2:]] = key
                out[s[2:].replace("-", "_")] = key
    return out


def convert(opt: Option, value: Any) -> Any:
    """The YAML ``value`` as the flag would have stored it; ``ValueError`` says why not."""
    if opt.kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{opt.key} must be true or false (got {_shown(value)})")
        return value
    if opt.kind == "list":
        items = value if isinstance(value, list) else [value]
        return [_scalar(opt, item) for item in items]
    return _scalar(opt, value)


def _scalar(opt: Option, value: Any) -> Any:
    action = opt.action
    if isinstance(value, (dict, list)) or value is None or isinstance(value, bool):
        raise ValueError(f"{opt.key} must be {_expected(action)} (got {_shown(value)})")
    if action.type is None and not isinstance(value, str) and not action.choices:
        raise ValueError(f"{opt.key} must be {_expected(action)} (got {_shown(value)})")
    text = str(value)
    try:
        out = action.type(text) if callable(action.type) else text
    except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
        if isinstance(exc, argparse.ArgumentTypeError):  # the flag's own check says why
            said = str(exc)
            raise ValueError(said if said.startswith(opt.key)
                             else f"{opt.key} {said} (got {_shown(value)})") from None
        raise ValueError(f"{opt.key} must be {_expected(action)} (got {_shown(value)})") \
            from None
    if action.choices is not None and out not in action.choices:
        allowed = ", ".join(str(c) for c in action.choices)
        raise ValueError(f"{opt.key} must be one of {allowed} (got {_shown(value)})")
    return out


def _expected(action: argparse.Action) -> str:
    kind = getattr(action.type, "__name__", "")
    if action.type is int or kind.endswith("int"):
        return "an integer"
    if action.type is float or kind.endswith(("gb", "float")):
        return "a number"
    if action.type is None:
        return "a string"
    return f"a valid {action.metavar or action.dest}"


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return "a mapping" if isinstance(value, dict) else "a list"
    return repr(value)
