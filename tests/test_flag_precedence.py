"""A flag beats its ``MLXBUN_*`` variable, for every serve flag that has one, and
``--config`` beats ``MLXBUN_CONFIG``.

The pairs are derived, never listed: a serve flag has a variable when the variable is
``MLXBUN_<DEST>`` and the package's code reads it, when the flag's help names it, or
when setting it changes the flag's default. Each gets a value from the variable and
another from the flag; the flag's must be the one parsed, and ``config show`` must say
it came from the flag.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

import pytest

import mlxbun_core
from mlxbun_core import cli
from mlxbun_core.config import apply_config
from mlxbun_core.config.schema import serve_subparser

# candidate values a flag's own type is asked to read (the first two it takes, and reads
# differently, are used; the fractions suit flags checked to [0, 1], such as --top-p)
CANDIDATES = ["3", "5", "1.5", "off", "on", "strict", "auto", "debug", "warning", "0.25", "0.5",
              "8"]
VARIABLE = re.compile(r"MLXBUN_[A-Z0-9_]+")


def variables_read_by_the_package() -> set[str]:
    root = Path(mlxbun_core.__file__).parent
    return {v for p in root.rglob("*.py") for v in VARIABLE.findall(p.read_text())}


def serve_actions() -> list[argparse.Action]:
    return [a for a in serve_subparser(cli.build_serve_parser())._actions
            if a.option_strings and a.dest != "help"]


def sets_the_default(var: str, action: argparse.Action, value: str) -> bool:
    """Whether ``var=value`` changes ``action``'s default (the parser built again)."""
    before = action.default
    saved = os.environ.get(var)
    os.environ[var] = value
    try:
        after = next(a.default for a in serve_actions() if a.dest == action.dest)
    except (ValueError, TypeError):
        return False
    finally:
        if saved is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = saved
    return after != before


def two_values(action: argparse.Action) -> tuple[str, str]:
    """``(variable's value, flag's value)``: two texts the flag reads differently."""
    if action.nargs == 0:  # a switch: the variable says off, the flag turns it on
        return "0", ""
    pool = [str(c) for c in action.choices] if action.choices else CANDIDATES
    read: dict = {}
    for text in pool:
        try:
            value = action.type(text) if callable(action.type) else text
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            continue
        if value not in read.values():
            read[text] = value
        if len(read) == 2:
            env_text, flag_text = read
            return env_text, flag_text
    raise AssertionError(f"no two values for {action.option_strings[0]} among {pool}")


def flag_variable_pairs() -> list[tuple[argparse.Action, str]]:
    read = variables_read_by_the_package()
    pairs = []
    for action in serve_actions():
        named = {f"MLXBUN_{action.dest.upper()}"} & read
        named |= set(VARIABLE.findall(action.help or "")) - {"MLXBUN_HOME"}
        if not named:
            named = {v for v in read if sets_the_default(v, action, two_values(action)[0])}
        pairs += [(action, var) for var in sorted(named)]
    return pairs


PAIRS = flag_variable_pairs()
FILE_PAIR = ("config_file", "MLXBUN_CONFIG")  # files, not values: its own test below
VALUE_PAIRS = [(a, var) for a, var in PAIRS if (a.dest, var) != FILE_PAIR]


@pytest.fixture
def home(tmp_path, monkeypatch):
    for var in [v for v in os.environ if v.startswith("MLXBUN_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("MLXBUN_HOME", str(tmp_path))
    return tmp_path


def test_the_derived_pairs_cover_the_known_ones():
    """The derivation finds what it must (a broken derivation would test nothing)."""
    found = {(a.dest, var) for a, var in PAIRS}
    assert {("port", "MLXBUN_PORT"), ("batch", "MLXBUN_BATCH"), ("kv_quant", "MLXBUN_KV_QUANT"),
            FILE_PAIR, ("fill", "MLXBUN_FILL"),
            ("adapter_mixing", "MLXBUN_ADAPTER_MIXING")} <= found
    assert len(found) >= 15


@pytest.mark.parametrize("action, var", VALUE_PAIRS,
                         ids=[f"{a.dest}-{v}" for a, v in VALUE_PAIRS])
def test_a_flag_beats_its_variable(home, monkeypatch, capsys, action, var):
    env_text, flag_text = two_values(action)
    flag = [action.option_strings[-1]] + ([flag_text] if action.nargs != 0 else [])
    monkeypatch.setenv(var, env_text)
    argv = ["serve", *flag]
    args = cli.build_parser().parse_args(argv)
    settings = apply_config(args, argv, cli.build_serve_parser)
    want: object = True if action.nargs == 0 else (
        action.type(flag_text) if callable(action.type) else flag_text)
    if isinstance(action, argparse._AppendAction):  # a repeatable flag gathers a list
        want = [want]
    assert getattr(args, action.dest) == want
    assert settings.sources[action.dest] == "flag"
    assert cli.main(["config", "show", "--json", *flag]) == 0
    assert json.loads(capsys.readouterr().out)["serve"][action.dest]["source"] == "flag"


def test_config_beats_mlxbun_config(home, monkeypatch):
    named, other = home / "named.yaml", home / "other.yaml"
    named.write_text("serve:\n  port: 9001\n  batch: 3\n")
    other.write_text("serve:\n  port: 9002\n  batch: 5\n  temperature: 0.5\n")
    monkeypatch.setenv("MLXBUN_CONFIG", str(other))
    argv = ["serve", "--config", str(named)]
    args = cli.build_parser().parse_args(argv)
    settings = apply_config(args, argv, cli.build_serve_parser)
    assert (args.port, args.batch, args.temperature) == (9001, 3, None)
    assert settings.sources["port"] == f"file:{named}:2"
    argv = ["serve"]  # without the flag, the variable names the file
    args = cli.build_parser().parse_args(argv)
    apply_config(args, argv, cli.build_serve_parser)
    assert (args.port, args.batch, args.temperature) == (9002, 5, 0.5)
