"""``make dist`` builds the seven wheels the README installs from (mlxbun and the six
family plugins; the example plugin stays out), and a fresh virtual environment that
installs them serves a tiny checkpoint: a real request answered by the installed code."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import openai

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.dist import build_dist, clean_env, install_fresh
from mlxbun_core.testing.process import ServerProcess
from mlxbun_core.testing.server import free_port

ROOT = Path(__file__).resolve().parents[1]
WHEELS = {"mlxbun", "mlxbun_gemma4", "mlxbun_glm52", "mlxbun_minicpm5", "mlxbun_qwen35",
          "mlxbun_qwen3_embed", "mlxbun_whisper"}


def test_the_readme_installs_from_dist():
    readme = (ROOT / "README.md").read_text()
    assert "make dist" in readme and "pip install --find-links dist mlxbun" in readme


def test_dist_wheels_install_into_a_fresh_venv_and_serve(tmp_path):
    t0 = time.monotonic()
    wheels = build_dist(ROOT, tmp_path / "dist")
    assert {w.name.split("-")[0] for w in wheels} == WHEELS and len(wheels) == len(WHEELS), wheels
    built = time.monotonic()
    venv = tmp_path / "venv"
    install_fresh(ROOT, tmp_path / "dist", venv)
    installed = time.monotonic()
    assert not (venv / "pyvenv.cfg").read_text().count("include-system-site-packages = true")
    port = free_port()
    env = {**clean_env(), "MLXBUN_HOME": str(tmp_path / "home")}
    cmd = [str(venv / "bin" / "mlxbun"), "serve", str(tiny_checkpoint("llama", seed=12)),
           "--port", str(port), "--no-open"]
    with ServerProcess(cmd, env=env) as proc:
        proc.wait_for_http(f"http://127.0.0.1:{port}/health", timeout=180)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x",
                               max_retries=0)
        r = client.chat.completions.create(model="m", max_tokens=4, temperature=0,
                                           messages=[{"role": "user", "content": "hi"}])
        assert r.usage.completion_tokens == 4 and r.choices[0].message.content
        assert "via plugin 'generic'" in proc.output
    where = subprocess.run([str(venv / "bin" / "python"), "-c",  # from the installed files
                            "import mlxbun_core, mlxbun_qwen35; print(mlxbun_core.__file__, "
                            "mlxbun_qwen35.__file__)"], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert where.returncode == 0 and where.stdout.count(str(venv)) == 2, where
    print(f"make dist {built - t0:.0f} s, fresh install {installed - built:.0f} s, "
          f"serve and answer {time.monotonic() - installed:.0f} s")
