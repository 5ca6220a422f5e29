"""pi (npm ``@earendil-works/pi-coding-agent``, installed by ``npm_clients``) on mlxbun:
``mlxbun launch pi``, ``mlxbun pi`` and ``mlxbun harness pi``, each with the real pi as a
child against a real server. The model is a tiny one-sliding-layer checkpoint whose
logits follow a script chosen from the prompt it was shown (tests/scripted_model.py), so
what pi prints is exact: the read tool's call, its result coming back, the answer. pi's
``/adapter`` command is driven through pi's RPC mode (JSON lines: the command's notices
come back as ``extension_ui_request`` events)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from mlxbun_core.console.finder import Server
from mlxbun_core.launch import pi as pi_config
from mlxbun_core.launch import pi_verb
from mlxbun_core.testing.clients import long_context_options
from mlxbun_core.testing.server import free_port
from scripted_model import scripted_server

RUN_TIMEOUT_S = 600
PI_SYSTEM = "You are an expert coding assistant operating inside pi"


@pytest.fixture(scope="module")
def server():
    with scripted_server("", name="scripted-pi", seed=3737, **long_context_options()) as pair:
        yield pair


def mlxbun(args: list[str], *, home: Path, npm_bin: Path | None, cwd: Path,
           env: dict | None = None) -> subprocess.CompletedProcess:
    """``mlxbun ARGS`` in a child as a user would type it: a throwaway HOME, the npm
    clients on PATH (or not), no pi settings or keys of the person running the tests."""
    home.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PI_", "OPENAI_"))}
    path = base.get("PATH", "")
    base.update(HOME=str(home), NO_COLOR="1", TERM="dumb",
                PATH=f"{npm_bin}{os.pathsep}{path}" if npm_bin else path)
    base.update(env or {})
    return subprocess.run([sys.executable, "-m", "mlxbun_core.cli", *args], cwd=cwd,
                          env=base, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=RUN_TIMEOUT_S)


def read_then_answer(path: Path, token: str):
    """The script: pi's read tool on ``path``; once its text is in the prompt, the answer."""
    call = json.dumps({"name": "read", "arguments": {"path": str(path)}})

    def reply(prompt: str) -> str:
        return f"The file says {token}." if token in prompt else f"<tool_call>{call}</tool_call>"
    return reply


def scripted_adapter(plugin, folder: Path, **kw) -> Path:
    """A LoRA adapter for the scripted checkpoint, in ``folder``: mlx-lm's layer names
    under the ScriptedModel's ``inner`` (its logits stay scripted; the field is what is
    tested here, the arithmetic in tests/test_adapters.py)."""
    import mlx.core as mx

    from mlxbun_core.testing.adapters import write_lora_adapter

    out = write_lora_adapter(plugin.path, folder, **kw)
    weights = mx.load(str(out / "adapters.safetensors"))
    mx.save_safetensors(str(out / "adapters.safetensors"),
                        {f"inner.{name}": value for name, value in weights.items()})
    return out


class RpcPi:
    """pi in ``--mode rpc`` (JSON lines on stdin and stdout), read by a thread."""

    def __init__(self, args: list[str], *, env: dict, cwd: Path):
        import queue
        import threading

        self.proc = subprocess.Popen(args, cwd=cwd, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def send(self, message: str) -> None:
        self.proc.stdin.write(json.dumps({"type": "prompt", "message": message}) + "\n")
        self.proc.stdin.flush()

    def until(self, wanted, timeout: float = RUN_TIMEOUT_S) -> dict:
        import time

        deadline = time.monotonic() + timeout
        while True:
            event = self.lines.get(timeout=max(deadline - time.monotonic(), 0.1))
            if event is None:
                raise AssertionError(f"pi exited: {self.proc.stderr.read()[-3000:]}")
            if wanted(event):
                return event

    def notice(self, command: str) -> tuple[str, str]:
        """``command``'s notification: (its level, its text)."""
        self.send(command)
        note = self.until(lambda e: e.get("type") == "extension_ui_request"
                          and e.get("method") == "notify", timeout=120)
        return note.get("notifyType", "info"), note["message"]

    def close(self) -> int:
        self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def test_launch_pi_runs_the_read_tool_against_the_server(server, npm_clients, tmp_path):
    srv, plugin = server
    token = f"mlxbun-{uuid.uuid4().hex[:12]}"
    (tmp_path / "hello.txt").write_text(token + "\n", encoding="utf-8")
    plugin.reply = read_then_answer(tmp_path / "hello.txt", token)
    seen = len(plugin.prompts)
    home = tmp_path / "home"
    done = mlxbun(["launch", "pi", "--port", str(srv.port), "--", "-p",
                   "What does hello.txt say?"], home=home,
                  npm_bin=npm_clients["pi"].parent, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.strip() == f"The file says {token}."
    assert f"using the server at {srv.base_url}" in done.stderr
    assert len(plugin.prompts) == seen + 2  # the tool call, then its result came back
    first, second = plugin.prompts[seen:]
    assert PI_SYSTEM in first and "What does hello.txt say?" in first
    assert token in second and token not in first
    assert not (home / ".pi").exists()  # the user's own pi config is never touched
    sessions = Path(os.environ["MLXBUN_HOME"]) / "pi-sessions"
    assert any(sessions.rglob("*.jsonl"))  # kept for `mlxbun pi -- --continue`


def test_mlxbun_pi_one_shot_json_with_serve_flags(server, npm_clients, tmp_path):
    srv, plugin = server
    plugin.reply = lambda prompt: "Hi from mlxbun."
    seen = len(plugin.prompts)
    done = mlxbun(["pi", "--port", str(srv.port), "--json", "-p", "say", "hi"],
                  home=tmp_path / "home", npm_bin=npm_clients["pi"].parent, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    ends = [e["message"] for e in events if e.get("type") == "message_end"
            and e["message"].get("role") == "assistant"]
    assert [part["text"] for m in ends for part in m["content"] if part["type"] == "text"] \
        == ["Hi from mlxbun."]
    assert ends[0]["provider"] == "mlxbun" and ends[0]["model"] == plugin.path.name
    assert len(plugin.prompts) == seen + 1 and "say hi" in plugin.prompts[seen]


def test_harness_pi_connects_the_users_own_pi_and_removes_itself(server, npm_clients,
                                                                 tmp_path):
    srv, plugin = server
    plugin.reply = lambda prompt: "Hello through the extension."
    home = tmp_path / "home"
    pi_bin = npm_clients["pi"].parent
    done = mlxbun(["harness", "pi", "--base-url", srv.base_url], home=home, npm_bin=pi_bin,
                  cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    extension = home / ".pi" / "agent" / "extensions" / "mlxbun-provider.ts"
    assert f"wrote {extension}" in done.stdout and plugin.path.name in done.stdout
    assert sorted(p.name for p in (home / ".pi").rglob("*")) == [
        "agent", "extensions", "mlxbun-provider.ts"]  # one file, nothing else of pi's
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TMPDIR")}
    env.update(HOME=str(home), PI_OFFLINE="1", NO_COLOR="1", TERM="dumb")
    pi = subprocess.run([str(npm_clients["pi"]), "--provider", "mlxbun", "--no-session", "-p",
                         "Say hello."], cwd=tmp_path, env=env, capture_output=True,
                        text=True, stdin=subprocess.DEVNULL, timeout=RUN_TIMEOUT_S)
    assert pi.returncode == 0, pi.stdout[-2000:] + pi.stderr[-2000:]
    assert pi.stdout.strip() == "Hello through the extension."
    done = mlxbun(["harness", "pi", "--remove"], home=home, npm_bin=pi_bin, cwd=tmp_path)
    assert done.returncode == 0 and f"removed {extension}" in done.stdout
    assert not extension.exists()


def test_harness_pi_adapter_installs_the_command_into_the_users_own_pi(server, npm_clients,
                                                                       tmp_path):
    srv, plugin = server
    home = tmp_path / "home"
    pi_bin = npm_clients["pi"].parent
    extensions = home / ".pi" / "agent" / "extensions"
    done = mlxbun(["harness", "pi", "--adapter", "--base-url", srv.v1], home=home,
                  npm_bin=pi_bin, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"wrote {extensions / 'mlxbun-adapter.ts'}: pi's /adapter command" in done.stdout
    assert sorted(p.name for p in extensions.iterdir()) == ["mlxbun-adapter.ts",
                                                            "mlxbun-provider.ts"]
    name = f"style-{uuid.uuid4().hex[:6]}"
    scripted_adapter(plugin, Path(os.environ["MLXBUN_HOME"]) / "adapters" / name, seed=3)
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TMPDIR")}
    env.update(HOME=str(home), PI_OFFLINE="1", NO_COLOR="1", TERM="dumb")
    pi = RpcPi([str(npm_clients["pi"]), "--provider", "mlxbun", "--mode", "rpc",
                "--no-session"], env=env, cwd=tmp_path)
    try:  # no MLXBUN_URL: the URL written at install time
        level, text = pi.notice("/adapter")
        assert level == "info" and f"mlxbun adapters at {srv.base_url}:" in text
        assert f"  {name}  " in text
    finally:
        assert pi.close() == 0
    port = free_port()  # a plain re-install moves the /adapter command along with it
    done = mlxbun(["harness", "pi", "--base-url", f"http://127.0.0.1:{port}"], home=home,
                  npm_bin=pi_bin, cwd=tmp_path)
    assert done.returncode == 0 and "/adapter command" in done.stdout
    assert (f'const DEFAULT_URL = "http://127.0.0.1:{port}";'
            in (extensions / "mlxbun-adapter.ts").read_text())
    done = mlxbun(["harness", "pi", "--remove", "--adapter"], home=home, npm_bin=pi_bin,
                  cwd=tmp_path)
    assert done.returncode == 0 and [p.name for p in extensions.iterdir()] == [
        "mlxbun-provider.ts"]
    done = mlxbun(["harness", "pi", "--remove"], home=home, npm_bin=pi_bin, cwd=tmp_path)
    assert done.returncode == 0 and not any(extensions.iterdir())


def test_harness_pi_respects_pi_config_dir_and_leaves_a_foreign_file(tmp_path):
    agent = tmp_path / "pi-config"
    port = free_port()  # nothing listens: the file is written, the models come at pi's start
    done = mlxbun(["harness", "pi", "--base-url", f"http://127.0.0.1:{port}/v1/"],
                  home=tmp_path / "home", npm_bin=None, cwd=tmp_path,
                  env={"PI_CODING_AGENT_DIR": str(agent)})
    assert done.returncode == 0, done.stderr
    text = (agent / "extensions" / "mlxbun-provider.ts").read_text()
    assert f'const BASE_URL = "http://127.0.0.1:{port}/v1";' in text
    assert "const FALLBACK = [];" in text and "no server answers" in done.stdout
    assert "npm install -g @earendil-works/pi-coding-agent" in done.stdout
    foreign = agent / "extensions" / "mlxbun-provider.ts"
    foreign.write_text("// mine\n")
    for args in (["harness", "pi"], ["harness", "pi", "--remove"]):
        done = mlxbun(args, home=tmp_path / "home", npm_bin=None, cwd=tmp_path,
                      env={"PI_CODING_AGENT_DIR": str(agent)})
        assert done.returncode == 2 and "left as it is" in done.stderr
    assert foreign.read_text() == "// mine\n"
    foreign.unlink()
    mine = agent / "extensions" / "mlxbun-adapter.ts"
    mine.write_text("// my own /adapter\n")
    for args in (["harness", "pi", "--adapter"], ["harness", "pi", "--remove", "--adapter"]):
        done = mlxbun(args, home=tmp_path / "home", npm_bin=None, cwd=tmp_path,
                      env={"PI_CODING_AGENT_DIR": str(agent)})
        assert done.returncode == 2 and f"{mine} is not one" in done.stderr
    assert mine.read_text() == "// my own /adapter\n"


def test_a_missing_pi_gets_its_npm_command_and_no_server(tmp_path):
    port = free_port()
    done = mlxbun(["pi", "--port", str(port), "-p", "hi"], home=tmp_path / "home",
                  npm_bin=None, cwd=tmp_path)
    assert done.returncode == 127
    assert "npm install -g @earendil-works/pi-coding-agent" in done.stderr
    assert "starting" not in done.stderr


def test_pi_words_map_onto_pi_and_serve_flags():
    split = pi_verb.split_pi_args
    assert split(["-q", "qwen", "--port", "8090", "fix", "the", "test"], False) == (
        ["-q", "qwen", "--port", "8090"], ["fix the test"])
    assert split(["-p", "--json", "summarize", "--ssd-cache=/kv"], False) == (
        ["--ssd-cache=/kv"], ["-p", "--mode", "json", "summarize"])
    assert split(["--mode", "rpc", "--verbose"], True) == ([], ["--mode", "rpc", "--verbose"])
    assert split(["review", "this"], True) == ([], ["-p", "review this"])  # piped stdin
    assert split(["--mode", "text", "--", "--continue"], False) == ([], ["-p", "--continue"])
    for bad in (["--resume"], ["--mode", "tui"], ["--mode"]):
        with pytest.raises(pi_verb.PiArgsError):
            split(bad, False)


def test_models_json_names_the_served_model_and_its_window(tmp_path):
    server = Server("http://127.0.0.1:9999", "acme/Coder-7B", 32768, "sk-1")
    env = pi_config.agent_dir(server, tmp_path)
    agent = Path(env["PI_CODING_AGENT_DIR"])
    provider = json.loads((agent / "models.json").read_text())["providers"]["mlxbun"]
    assert provider["baseUrl"] == "http://127.0.0.1:9999/v1"
    assert provider["api"] == "openai-completions" and provider["apiKey"] == "sk-1"
    assert provider["compat"]["supportsDeveloperRole"] is False
    [model] = provider["models"]
    assert (model["id"], model["contextWindow"], model["maxTokens"]) == (
        "acme/Coder-7B", 32768, 8192)
    assert (agent / "models.json").stat().st_mode & 0o077 == 0  # the key is the user's alone
    settings = json.loads((agent / "settings.json").read_text())
    assert (settings["defaultProvider"], settings["defaultModel"]) == ("mlxbun", "acme/Coder-7B")
    assert env["PI_OFFLINE"] == "1" and env["PI_TELEMETRY"] == "0"
    adapter = (agent / "extensions" / "mlxbun-adapter.ts").read_text()
    assert 'const DEFAULT_URL = "http://127.0.0.1:9999";' in adapter
    assert (env["MLXBUN_URL"], env["MLXBUN_API_KEY"]) == ("http://127.0.0.1:9999", "sk-1")


def test_launch_pi_adapter_command_lists_mounts_and_sends_the_adapter(server, npm_clients,
                                                                      tmp_path, monkeypatch):
    import httpx

    srv, plugin = server
    plugin.reply = lambda prompt: "Hi with an adapter."
    folder = Path(os.environ["MLXBUN_HOME"]) / "adapters"
    tone, other = (f"{name}-{uuid.uuid4().hex[:6]}" for name in ("tone", "other"))
    scripted_adapter(plugin, folder / tone, seed=1)
    scripted_adapter(plugin, folder / other, seed=2, base_model="acme/Other-1B")
    asked: list = []  # the `adapter` field of each request the engine resolved
    manager = srv.engine.adapters
    resolve = manager.resolve
    monkeypatch.setattr(manager, "resolve", lambda spec: asked.append(spec) or resolve(spec))

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PI_", "OPENAI_"))}
    env.update(HOME=str(tmp_path / "home"), NO_COLOR="1", TERM="dumb", MLXBUN_URL="http://x:1",
               PATH=f"{npm_clients['pi'].parent}{os.pathsep}{env.get('PATH', '')}")
    pi = RpcPi([sys.executable, "-m", "mlxbun_core.cli", "launch", "pi", "--port",
                str(srv.port), "--", "--mode", "rpc", "--no-session"], env=env, cwd=tmp_path)
    try:
        level, text = pi.notice("/adapter")
        assert level == "info" and f"mlxbun adapters at {srv.base_url}:" in text
        assert tone in text and f"{other}  (trained on acme/Other-1B: needs --force)" in text
        assert text.endswith("active: none (requests get the base model)")
        level, text = pi.notice("/adapter nope")
        assert level == "error" and "no adapter nope on disk" in text and tone in text
        level, text = pi.notice(f"/adapter {tone}")
        assert (level, text) == ("info", f"loaded {tone}; adapter {tone} active: every "
                                          "request to mlxbun carries it")
        mounted = httpx.get(srv.v1 + "/adapters").json()["adapters"]
        assert tone in [row["id"] for row in mounted]

        pi.send("say hi")
        end = pi.until(lambda e: e.get("type") == "agent_end")
        texts = [part["text"] for m in end["messages"] if m.get("role") == "assistant"
                 for part in m["content"] if part["type"] == "text"]
        assert texts == ["Hi with an adapter."]
        assert asked and set(asked) == {tone}

        level, text = pi.notice(f"/adapter {other}")
        assert level == "error" and "force" in text  # the server's 400, said in pi
        level, text = pi.notice(f"/adapter {tone}+{other} --force")
        assert level == "info" and text.startswith(f"loaded {other}; adapter {tone}+{other}")
        level, text = pi.notice("/adapter list")
        assert f"{other}  (loaded, trained on acme/Other-1B" in text
        assert text.endswith(f"active: {tone}+{other}")
        assert pi.notice("/adapter off") == ("info", "adapter off: requests carry no "
                                                     "adapter field")
        asked.clear()
        pi.send("say hi again")
        pi.until(lambda e: e.get("type") == "agent_end")
        assert asked and set(asked) == {None}
    finally:
        assert pi.close() == 0
