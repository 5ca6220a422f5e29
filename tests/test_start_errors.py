"""What a new user sees when the model or the port is wrong: one clear line, at once."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

from mlxbun_core.testing.server import free_port

CLI = [sys.executable, "-m", "mlxbun_core.cli"]


def run(args, **env) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = subprocess.run(CLI + args, capture_output=True, text=True, timeout=120,
                       env={**os.environ, **env})
    return r, time.monotonic() - t0


def closed_port() -> int:
    port = free_port()  # bound and released: nothing listens there
    return port


def test_an_uncached_hub_id_while_offline_fails_at_once_in_one_line(tmp_path):
    """The hub cannot be reached: no client retries (they took 24 s and printed each
    retry twice), one line that says so."""
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hf" / "hub"),
           "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}", "HF_HUB_OFFLINE": "0"}
    r, took = run(["serve", "acme/nothing-here", "--port", str(free_port())], **env)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "Retrying" not in out
    lines = [line for line in out.splitlines() if "acme/nothing-here" in line]
    assert len(lines) == 1, out
    assert "cannot be reached" in lines[0] and "offline" in lines[0]
    assert took < 15, took  # the retries alone took 23 s


def test_hub_offline_says_so(tmp_path):
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hf" / "hub"),
           "HF_HUB_OFFLINE": "1"}
    r, _ = run(["serve", "acme/nothing-here", "--port", str(free_port())], **env)
    assert r.returncode == 2 and "HF_HUB_OFFLINE is set" in r.stderr
    assert "`mlxbun download acme/nothing-here`" in r.stderr and "hf download" not in r.stderr


def test_download_says_its_error_once(tmp_path):
    """The hub is unreachable: the reason once (it was printed by the progress bar and
    again at exit), and no empty progress bar."""
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hf" / "hub"),
           "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}", "HF_HUB_OFFLINE": "0",
           "MLXBUN_HOME": str(tmp_path / "home")}
    r, _ = run(["download", "acme/nothing-here"], **env)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert out.count("cannot be reached") == 1, out
    assert "0.00B" not in out, out


def test_embedding_on_a_model_that_cannot_embed_is_refused_at_start():
    """`--embedding` on a llama checkpoint (no installed family embeds llama) used to be
    ignored: it served a chat model. Now start-up stops and names what can embed."""
    from mlxbun_core.testing.checkpoints import tiny_checkpoint
    from mlxbun_core.testing.process import serve

    path = tiny_checkpoint("llama", seed=2)
    with serve(path, "--embedding", "--no-open", ready=None) as proc:
        rc = proc.proc.wait(120)
    assert rc == 2, proc.output
    line = next(ln for ln in proc.output.splitlines() if "--embedding" in ln)
    assert "llama" in line and "qwen3_embed" in line, line
    assert "serving" not in proc.output and "Traceback" not in proc.output


def test_a_text_file_named_gguf_is_not_a_gguf_file(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_text("hello, I am a text file\n")
    r, _ = run(["serve", str(fake), "--port", str(free_port())])
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{fake} is not a GGUF file" in r.stderr
    assert "Traceback" not in r.stderr and "larger dtype" not in r.stderr


def test_a_wrong_model_is_said_before_the_engine_is_imported(tmp_path):
    """The model is found before seconds of MLX and mlx-lm imports (they made every wrong
    name, offline hub or non-GGUF file wait 5-15 s under load)."""
    fake = tmp_path / "model.gguf"
    fake.write_text("hello, I am a text file\n")
    code = ("import sys; from mlxbun_core.cli import main; "
            f"rc = main(['serve', {str(fake)!r}, '--port', '{free_port()}']); "
            "print('imported', sorted(m for m in ('mlx_lm', 'mlxbun_core.engine.core') "
            "if m in sys.modules)); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "is not a GGUF file" in r.stderr, r.stdout + r.stderr
    assert "imported []" in r.stdout, r.stdout


def busy_pair() -> tuple[socket.socket, socket.socket, int]:
    """Two listening sockets on consecutive ports ``port`` and ``port + 1``."""
    for _ in range(50):
        a = socket.socket()
        a.bind(("127.0.0.1", 0))
        port = a.getsockname()[1]
        b = socket.socket()
        try:
            b.bind(("127.0.0.1", port + 1))
        except OSError:
            a.close()
            b.close()
            continue
        a.listen()
        b.listen()
        return a, b, port
    raise RuntimeError("no two consecutive free ports")


def test_the_busy_port_hint_names_a_free_port():
    a, b, port = busy_pair()
    with a, b:
        r, _ = run(["serve", "--port", str(port)])
        assert r.returncode == 2, r.stderr
        hint = re.search(r"--port (\d+) \(free now\)", r.stderr)
        assert hint, r.stderr
        suggested = int(hint.group(1))
        assert suggested not in (port, port + 1)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", suggested))  # really free


def test_help_shows_the_host_and_port_defaults():
    r, _ = run(["serve", "--help"], MLXBUN_HOST="", MLXBUN_PORT="")
    text = " ".join(r.stdout.split())
    assert "default: 127.0.0.1" in text and "default: 8080" in text


def test_isolate_with_a_model_that_does_not_exist_exits(tmp_path):
    """``--isolate``: the default engine refuses its first start (exit 2, the reason on
    stderr); the parent stops too, with that status, instead of restarting it and
    serving 503s for good."""
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hf" / "hub"),
           "HF_HUB_OFFLINE": "1", "MLXBUN_HOME": str(tmp_path / "home")}
    r, _ = run(["serve", "--isolate", "acme/nothing-here", "--port", str(free_port())],
                  **env)
    assert r.returncode == 2, r.stderr
    assert "HF_HUB_OFFLINE is set" in r.stderr and "refused to start" in r.stderr
    assert r.stderr.count("HF_HUB_OFFLINE is set") == 1  # started once, not restarted
