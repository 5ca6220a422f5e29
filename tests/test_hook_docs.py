"""Every hook spec is documented in docs/plugins.md, as it is declared: a section of its
own, and a row of the reference table with its arguments in order and its kind
(``firstresult`` or all called); the table names no hook that does not exist. (datasette
keeps its plugin hooks documented the same way.)"""

from __future__ import annotations

import re
from pathlib import Path

import pluggy
import pytest

from mlxbun_core import hookspecs

DOC = (Path(__file__).resolve().parent.parent / "docs" / "plugins.md").read_text()


def declared() -> dict[str, tuple[list[str], str]]:
    """hook name -> (its arguments, its kind), as pluggy reads ``hookspecs.py``."""
    pm = pluggy.PluginManager("mlxbun")
    pm.add_hookspecs(hookspecs)
    out = {}
    for name, caller in vars(pm.hook).items():
        spec = getattr(caller, "spec", None)
        if spec is not None:
            kind = "firstresult" if spec.opts.get("firstresult") else "all called"
            out[name] = (list(spec.argnames), kind)
    return out


SPECS = declared()
# reference rows: | `name(a, b)` | kind | ...
ROWS = {m[1]: ([a.strip() for a in m[2].split(",") if a.strip()], m[3].strip())
        for m in re.finditer(r"^\| `(\w+)\(([^)]*)\)` \| ([^|]+) \|", DOC, re.M)}


def test_the_specs_are_read():
    assert {"claims", "load_model", "render_chat", "register_grammar_backends"} <= set(SPECS)


@pytest.mark.parametrize("hook", sorted(SPECS))
def test_every_hook_has_a_section_and_a_reference_row(hook):
    assert re.search(rf"^###[^\n]*`{hook}`", DOC, re.M), f"docs/plugins.md: no ### `{hook}`"
    assert hook in ROWS, f"docs/plugins.md: no reference row for {hook}"
    assert ROWS[hook] == SPECS[hook], f"{hook}: the doc's (arguments, kind) differ"


def test_the_reference_names_only_hooks_that_exist():
    assert sorted(set(ROWS) - set(SPECS)) == []
