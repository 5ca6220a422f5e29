"""Settings come from the run configuration (``mlxbun_core/runconfig.py``), built once at
start-up: nothing below start-up reads the environment for a setting.

Every ``os.environ`` or ``os.getenv`` read in ``mlxbun_core/`` and the family plugins'
packages must sit in a module allowed below, each for a stated reason. A setting read
anywhere else fails here: give it a field in :mod:`mlxbun_core.runconfig` instead.
Writes (``os.environ[NAME] = ...``) are no reads and are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREES = [ROOT / "mlxbun_core", *sorted((ROOT / "plugins").glob("*/mlxbun_*"))]

ALLOWED = {
    # the start-up builders: the run configuration and the serve options' sources
    "mlxbun_core/runconfig.py", "mlxbun_core/config/runtime.py",
    "mlxbun_core/config/effective.py",
    # flag definitions and CLI verbs' own top level (argparse defaults from MLXBUN_*)
    "mlxbun_core/serve_flags.py", "mlxbun_core/kvstore/flags.py",
    "mlxbun_core/console/finder.py", "mlxbun_core/console/cache_verb.py",
    # pi's own config-dir variable and the key a CLI verb probes the server with
    "mlxbun_core/launch/pi_harness.py",
    "mlxbun_core/console/lm_eval_run.py",  # MLXBUN_LM_EVAL: the lm_eval command to run
    # an environment handed to a subprocess (passed on or scrubbed)
    "mlxbun_core/launch/__init__.py", "mlxbun_core/jobs/runner.py", "mlxbun_core/isolate/child.py",
    "mlxbun_core/webchat/coding/workspace.py",
    "mlxbun_core/memory/schedule.py",  # the scheduled job's MLXBUN_HOME, HF_HOME, PYTHONPATH
    # the marker a process that warned of the slow BLAS leaves its children (it writes it)
    "mlxbun_core/blas/__init__.py",
    # HOME / XDG / Hugging Face locations, token and offline switch, read where used
    # because a long-running server and tests move them with the environment
    "mlxbun_core/models/paths.py", "mlxbun_core/models/resolve.py",
    "mlxbun_core/hub/remote.py", "mlxbun_core/hub/settings.py", "mlxbun_core/jobs/quantize.py",
    "mlxbun_core/memory/schedulers.py",  # XDG_CONFIG_HOME: where systemd looks for units
    "mlxbun_core/memory/vault.py",  # MLXBUN_WIKI: the vault's folder, beside MLXBUN_HOME's
    # MLX_PTX_CACHE_DIR: MLX's own variable for where its CUDA build keeps compiled
    # kernels, set to the home unless the user set it
    "mlxbun_core/backend.py",
    # the launcher's rendezvous (mlx.launch, NCCL, JACCL set these, not the user)
    "mlxbun_core/distributed/group.py",
    # test helpers
    "mlxbun_core/testing/home.py", "mlxbun_core/testing/helpers.py",
    "mlxbun_core/testing/clients.py", "mlxbun_core/testing/dist.py",
    "mlxbun_core/testing/speech.py", "mlxbun_core/testing/process.py",
}


def _os_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv")
            and isinstance(node.value, ast.Name) and node.value.id == "os")


def env_reads(tree: ast.AST) -> list[int]:
    """Lines of ``os.environ`` / ``os.getenv`` uses that are not plain writes, and of
    ``from os import environ`` / ``getenv``."""
    written = {id(t.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
               for t in node.targets if isinstance(t, ast.Subscript)}
    used = [n.lineno for n in ast.walk(tree) if _os_environ(n) and id(n) not in written]
    imported = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                and n.module == "os" and {a.name for a in n.names} & {"environ", "getenv"}]
    return sorted(used + imported)


def reads_by_module() -> dict[str, list[int]]:
    found = {}
    for tree in TREES:
        for path in sorted(tree.rglob("*.py")):
            lines = env_reads(ast.parse(path.read_text()))
            if lines:
                found[path.relative_to(ROOT).as_posix()] = lines
    return found


READS = reads_by_module()


def test_the_scan_sees_reads_and_not_writes():
    code = ("import os\nfrom os import getenv\na = os.environ.get('X')\n"
            "os.environ['Y'] = '1'\nb = {**os.environ}\nc = os.getenv('Z')\n")
    assert env_reads(ast.parse(code)) == [2, 3, 5, 6]
    assert READS.get("mlxbun_core/runconfig.py")  # the builder is found by the scan


def test_nothing_below_start_up_reads_the_environment_for_a_setting():
    outside = {m: lines for m, lines in READS.items() if m not in ALLOWED}
    assert outside == {}, "read these through mlxbun_core.runconfig.current()"


def test_the_lists_name_only_modules_that_read():
    assert sorted(ALLOWED - set(READS)) == []  # moved: take it off


# the start-up builders, and the test helpers (which change the installed object)
BUILDERS = {"mlxbun_core/runconfig.py", "mlxbun_core/config/runtime.py"}


def builds(tree: ast.AST) -> list[int]:
    """Lines that build a run configuration: ``from_environ(...)``, ``RunConfig(...)``,
    ``install(...)`` of the run configuration."""
    names = {"from_environ", "RunConfig", "install"}
    imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                and (n.module or "").endswith("runconfig") for a in n.names} & names
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    return sorted(n.lineno for n in calls if (isinstance(n.func, ast.Name)
                                               and n.func.id in imported)
                  or (isinstance(n.func, ast.Attribute) and n.func.attr in names
                      and isinstance(n.func.value, ast.Name) and n.func.value.id == "runconfig"))


def test_the_scan_sees_a_configuration_being_built():
    code = ("from mlxbun_core.runconfig import from_environ, current\n"
            "import os\na = from_environ(os.environ)\nb = current()\n"
            "from mlxbun_core import runconfig\nc = runconfig.RunConfig()\n")
    assert builds(ast.parse(code)) == [3, 6]


def test_only_start_up_builds_the_run_configuration():
    """Below start-up a module reads ``current()``; only the builders (and ``startup``,
    which installs what they build) make one."""
    found = {}
    for tree in TREES:
        for path in sorted(tree.rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            lines = builds(ast.parse(path.read_text()))
            if lines and name not in BUILDERS | {"mlxbun_core/startup.py"} \
                    and not name.startswith("mlxbun_core/testing/"):
                found[name] = lines
    assert found == {}
