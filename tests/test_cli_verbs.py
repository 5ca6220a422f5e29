"""The CLI loads plugins only for what needs their verbs: a core verb or ``--version``
starts without them, while ``--help``, ``help`` and a plugin's verb still see every verb."""

import subprocess
import sys

from mlxbun_core import cli

PROBE = """
import sys
from mlxbun_core import cli, plugins
try:
    status = cli.main({argv!r})
except SystemExit as exc:
    status = exc.code
print("LOADED", plugins._loaded, "mlxbun_core.plugins_builtin.generic" in sys.modules, status)
"""


def run(*argv):
    r = subprocess.run([sys.executable, "-c", PROBE.format(argv=list(argv))],
                       capture_output=True, text=True, timeout=120)
    last = [line for line in r.stdout.splitlines() if line.startswith("LOADED")]
    assert last, r.stdout + r.stderr
    return last[-1].split()[1:], r.stdout + r.stderr


def test_a_core_verb_and_the_version_start_without_loading_a_plugin():
    for argv in (["--version"], ["convert", "--help"], ["config", "show"]):
        (loaded, generic, status), _ = run(*argv)
        assert (loaded, generic, status) == ("False", "False", "0"), argv


def test_the_help_and_a_plugin_verb_still_see_the_plugins_verbs():
    (loaded, _, status), out = run("--help")
    assert (loaded, status) == ("True", "0")
    assert all(verb in out for verb in ("train", "quantize", "memory", "serve", "ls"))
    (loaded, _, status), out = run("memory", "--help")
    assert (loaded, status) == ("True", "0") and "usage: mlxbun memory" in out
    (loaded, _, status), out = run("frobnicate")
    assert (loaded, status) == ("True", "2") and "'train'" in out  # the typo's error lists them


def test_which_command_lines_want_the_plugins_verbs():
    core = {"serve", "ls", "help"}
    wants = [cli.wants_plugin_verbs(argv, core) for argv in (
        ["serve"], ["ls", "--help"], ["--version"], ["--help"], ["-h"], ["help", "train"],
        ["train"], [])]
    assert wants == [False, False, False, True, True, True, True, True]  # none: the usage lists all
