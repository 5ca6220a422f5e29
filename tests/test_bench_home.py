"""Benches that start servers keep them out of the user's mlxbun home: a temporary
``MLXBUN_HOME`` unless the bench is given ``--home`` (a server writes
``<home>/serving/*.json`` while it runs; a pytest run beside a bench used to fail with
"real mlxbun home changed"). Real ``mlxbun serve`` processes started through the
benches' shared start helper, in a child process as a bench runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from mlxbun_core.testing.checkpoints import tiny_checkpoint

BENCH = Path(__file__).resolve().parent.parent / "bench"
CHILD = """
import json, os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from serve_concurrency import free_port, start
import bench_home

ckpt, real, given = sys.argv[2], Path(sys.argv[3]), sys.argv[4] or None
if given:
    bench_home.use(given)  # what a bench's main does with --home
port = free_port()
cmd = [sys.executable, "-m", "mlxbun_core.cli", "serve", ckpt, "--port", str(port),
       "--no-open"]
proc = start(cmd, port, sys.argv[5])
home = Path(os.environ["MLXBUN_HOME"])
seen = {"home": str(home), "records": [p.name for p in (home / "serving").glob("*.json")],
        "real": [p.name for p in real.rglob("*")]}
proc.terminate()
proc.wait(60)
print(json.dumps(seen))
"""


def run_bench(tmp_path: Path, given: Path | None) -> tuple[dict, Path]:
    real = tmp_path / "real-home"
    real.mkdir()
    env = {**__import__("os").environ, "MLXBUN_HOME": str(real)}
    r = subprocess.run([sys.executable, "-c", CHILD, str(BENCH), str(tiny_checkpoint("llama")),
                        str(real), str(given or ""), str(tmp_path / "server.log")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:] + (tmp_path / "server.log").read_text()[-3000:]
    return json.loads(r.stdout.splitlines()[-1]), real


def test_a_bench_server_gets_a_temporary_home(tmp_path):
    seen, real = run_bench(tmp_path, None)
    assert seen["home"] != str(real) and seen["records"], seen  # it served from the temp home
    assert seen["real"] == [] and list(real.iterdir()) == []  # the real one: untouched
    assert not Path(seen["home"]).exists()  # removed when the bench ended


def test_home_names_the_home_a_bench_server_uses(tmp_path):
    given = tmp_path / "given"
    seen, real = run_bench(tmp_path, given)
    assert seen["home"] == str(given) and seen["records"], seen
    assert seen["real"] == [] and given.is_dir()  # kept: the operator's own
