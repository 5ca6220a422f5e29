"""mlxbun.yaml: flags > MLXBUN_* variables > the file > built-in defaults, where each value
came from (`mlxbun config show`), errors that name the file and line, aliases, per-model
settings on an engine, what --isolate children get, and Ollama-style keep_alive values."""

import argparse
import json
import math
import re
from types import SimpleNamespace

import pytest

from mlxbun_core import cli
from mlxbun_core.config import ConfigError, apply_config, parse_keep_alive
from mlxbun_core.config.permodel import apply_model_settings

GOOD = """\
serve:
  port: 9000
  temperature: 0.3
  kv-quant: 4
  batch: 6
  keep_alive: 5m
aliases:
  coder: acme/Tiny-Coder
models:
  coder:
    temperature: 0.1
    top_k: 20
    max_tokens: 64
    chat_template_kwargs: {enable_thinking: false}
    keep_alive: -1
"""


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A clean $MLXBUN_HOME and no MLXBUN_* serve variables."""
    import os

    for var in [v for v in os.environ if v.startswith("MLXBUN_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("MLXBUN_HOME", str(tmp_path))
    return tmp_path


def serve(*flags):
    argv = ["serve", *flags]
    args = cli.build_parser().parse_args(argv)
    settings = apply_config(args, argv, cli.build_serve_parser)
    return args, settings


def test_precedence_flag_over_env_over_file_over_default(home, monkeypatch):
    (home / "mlxbun.yaml").write_text(GOOD)
    monkeypatch.setenv("MLXBUN_BATCH", "3")
    monkeypatch.setenv("MLXBUN_PORT", "8080")  # equal to the built-in default: still the env's
    args, s = serve("--temperature", "0.9")
    path = home / "mlxbun.yaml"
    assert (args.temperature, s.sources["temperature"]) == (0.9, "flag")
    assert (args.batch, s.sources["batch"]) == (3, "env MLXBUN_BATCH")
    assert (args.port, s.sources["port"]) == (8080, "env MLXBUN_PORT")
    assert (args.kv_quant, s.sources["kv_quant"]) == ("4", f"file:{path}:4")
    assert (args.keep_alive, s.sources["keep_alive"]) == (300.0, f"file:{path}:6")
    assert (args.top_p, s.sources["top_p"]) == (None, "default")


def test_cors_comes_from_flags_env_or_file_and_flags_replace_the_env(home, monkeypatch):
    path = home / "mlxbun.yaml"
    path.write_text("serve:\n  cors:\n    - https://a.example\n    - http://localhost:5173\n")
    args, s = serve()
    assert (args.cors, s.sources["cors"]) == (
        ["https://a.example", "http://localhost:5173"], f"file:{path}:3")
    monkeypatch.setenv("MLXBUN_CORS", "https://b.example, https://c.example")
    args, s = serve()
    assert (args.cors, s.sources["cors"]) == (["https://b.example", "https://c.example"],
                                              "env MLXBUN_CORS")
    args, s = serve("--cors", "https://d.example", "--cors", "*")
    assert (args.cors, s.sources["cors"]) == (["https://d.example", "*"], "flag")


def test_every_serve_flag_is_a_key_and_unknown_keys_are_refused(home):
    from mlxbun_core.config.schema import serve_options

    keys = serve_options(cli.build_parser())
    for dest in ("host", "prompt_cache", "ssd_cache_max", "isolate", "pins", "allow_models",
                 "keep_alive", "grammar_backend", "memory_budget"):
        assert dest in keys
    (home / "mlxbun.yaml").write_text("serve:\n  port: 9000\n  prot: 1\n")
    with pytest.raises(ConfigError) as bad:
        serve()
    assert str(bad.value).startswith(f"{home / 'mlxbun.yaml'}:3: unknown serve setting 'prot'")


@pytest.mark.parametrize("text, line, words", [
    ("serve:\n  port: nine\n", 2, "port must be an integer"),
    ("serve:\n  batch: 0\n", 2, "batch must be at least 1"),
    ("serve:\n  isolate: 1\n", 2, "isolate must be true or false"),
    ("serve:\n  keep-alive: soon\n", 2, "keep_alive 'soon' is not a duration"),
    ("serve:\n\n  kv_quant: 5\n", 3, "kv_quant must be one of off, 4, 8"),
    ("serve:\n  temperature: [1]\n", 2, "temperature must be a number"),
    ("sever:\n  port: 1\n", 1, "unknown section 'sever'"),
    ("serve: [1\n", 2, "not valid YAML"),
    ("serve:\n  port: 1\n  port: 2\n", 3, "'port' appears twice"),
    ("aliases:\n  coder: 3\n", 2, "alias 'coder' must name a model id"),
    ("models:\n  x:\n    temperature: hot\n", 3, "temperature must be of type"),
    ("models:\n  x:\n    top_p: 2\n", 3, "top_p must be at most 1"),
    ("models:\n  x:\n    colour: red\n", 3, "unknown setting models.x.colour"),
    ("models:\n  x:\n    keep_alive: 5q\n", 3, "is not a duration"),
])
def test_mistakes_name_the_file_and_line(home, text, line, words):
    (home / "mlxbun.yaml").write_text(text)
    with pytest.raises(ConfigError) as bad:
        serve()
    assert bad.value.line == line and words in bad.value.message
    assert str(bad.value).startswith(f"{home / 'mlxbun.yaml'}:{line}: ")


def test_serve_with_a_bad_file_exits_2_before_loading_anything(home, tmp_path, capsys):
    bad = tmp_path / "elsewhere.yaml"
    bad.write_text("serve:\n  port: high\n")
    assert cli.main(["serve", "--config", str(bad)]) == 2
    assert f"{bad}:2: port must be an integer" in capsys.readouterr().err
    assert cli.main(["serve", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "no such config file" in capsys.readouterr().err


def test_config_show_says_where_each_value_came_from(home, capsys, monkeypatch):
    (home / "mlxbun.yaml").write_text(GOOD)
    monkeypatch.setenv("MLXBUN_BATCH", "3")
    assert cli.main(["config", "show", "--json", "--temperature", "0.9"]) == 0
    report = json.loads(capsys.readouterr().out)
    path = str(home / "mlxbun.yaml")
    assert report["config_file"] == path
    serve_rows = report["serve"]
    assert serve_rows["temperature"] == {"value": 0.9, "source": "flag", "flag": "--temperature"}
    assert serve_rows["batch"]["source"] == "env MLXBUN_BATCH"
    assert serve_rows["port"] == {"value": 9000, "source": f"file:{path}:2", "flag": "--port"}
    assert serve_rows["host"]["source"] == "default"
    assert report["aliases"]["coder"] == {"model": "acme/Tiny-Coder", "source": f"file:{path}:8"}
    assert report["models"]["coder"]["settings"]["keep_alive"] == "forever"
    assert cli.main(["config", "show"]) == 0
    text = capsys.readouterr().out
    # the key column is as wide as the longest serve key
    assert re.search(r"^  port +9000 ", text, re.M) and f"file:{path}:2" in text


def test_api_key_is_never_printed(home, capsys):
    assert cli.main(["config", "show", "--json", "--api-key", "sesame"]) == 0
    out = capsys.readouterr().out
    assert "sesame" not in out and json.loads(out)["serve"]["api_key"]["value"] == "(set)"


def test_an_alias_names_the_model_to_serve(home):
    (home / "mlxbun.yaml").write_text(GOOD)
    args, s = serve("coder")
    assert args.positional == "acme/Tiny-Coder" and s.resolve("coder") == "acme/Tiny-Coder"
    assert s.model("acme/Tiny-Coder").key == "coder"  # models: keyed by the alias


def test_per_model_settings_lose_to_flags_and_beat_the_serve_section(home):
    (home / "mlxbun.yaml").write_text(GOOD)
    args, _ = serve("--top-k", "5")
    engine = SimpleNamespace(model=SimpleNamespace(id="acme/Tiny-Coder"), max_tokens=None,
                             defaults={"temperature": args.temperature, "top_k": args.top_k},
                             template_defaults={})
    applied = apply_model_settings(engine, args)
    assert engine.defaults == {"temperature": 0.1, "top_k": 5}  # the flag's top_k stays
    assert engine.max_tokens == 64 and engine.template_defaults == {"enable_thinking": False}
    assert "top_k" not in applied
    other = SimpleNamespace(model=SimpleNamespace(id="someone/else"), defaults={})
    assert apply_model_settings(other, args) == {} and other.defaults == {}


def test_isolate_children_read_the_file_themselves(home):
    """The parent passes on what was typed (and --config), never the file's values; a
    child skips the file's parent-only keys (or it would start a pool of its own)."""
    from mlxbun_core.isolate.launch import engine_argv

    cfg = home / "other.yaml"
    cfg.write_text("serve:\n  isolate: true\n  model_pool: 2\n  batch: 6\n  pin: [x]\n")
    args, _ = serve("--config", str(cfg), "--temperature", "0.5")
    argv = engine_argv(args, cli.build_parser())
    assert argv == ["--temperature", "0.5", "--config", str(cfg)]
    child, s = serve("--model", "/m", *argv, "--unix", "/tmp/x.sock")
    assert (child.isolate, child.model_pool, child.pins, child.batch) == (False, 1, None, 6)
    assert s.sources["batch"].startswith("file:") and s.sources["isolate"] == "default"


@pytest.mark.parametrize("value, seconds", [
    ("5m", 300.0), ("1h30m", 5400.0), ("250ms", 0.25), ("90", 90.0), (30, 30.0), (2.5, 2.5),
    (0, 0.0), ("0", 0.0), (-1, math.inf), ("-1", math.inf), ("-5m", math.inf), (" 10s ", 10.0),
])
def test_keep_alive_reads_as_ollama_does(value, seconds):
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5", "", "m", "5x", True, None, [1], {"s": 1}])
def test_keep_alive_refuses_what_is_no_duration(value):
    if value == "5":
        assert parse_keep_alive(value) == 5.0
        return
    with pytest.raises(ValueError):
        parse_keep_alive(value)


def test_keep_alive_flag_is_checked_by_argparse():
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "--keep-alive", "soon"])
    assert cli.build_parser().parse_args(["serve", "--keep-alive", "2m"]).keep_alive == 120.0


def test_pool_pins_must_be_local_and_fit_the_pool(home):
    from mlxbun_core.isolate.launch import PoolError, pool_setup
    from mlxbun_core.isolate.pool import ModelSpec

    (home / "mlxbun.yaml").write_text(GOOD)
    entries = {i: SimpleNamespace(id=i, path="/snap") for i in ("acme/Tiny-Coder", "acme/Two")}
    library = SimpleNamespace(find=entries.get)
    default = ModelSpec("acme/Default", "/d")
    args, _ = serve("--pin", "coder", "--model-pool", "2", "--allow-model", "x/y")
    pins, policy, keep = pool_setup(args, default, library)
    assert pins == (ModelSpec("acme/Tiny-Coder", "/snap"),)
    assert policy.allowed == {"x/y", "acme/Default", "acme/Tiny-Coder"}
    assert policy.allows("coder") and not policy.allows("z/z")
    assert keep("acme/Tiny-Coder") == math.inf and keep("x/y") is None
    args, _ = serve("--pin", "nothing/here", "--model-pool", "2")
    with pytest.raises(PoolError, match="no local model 'nothing/here'"):
        pool_setup(args, default, library)
    args, _ = serve("--pin", "coder", "--pin", "acme/Default")
    with pytest.raises(PoolError, match="other than the default needs --model-pool 2"):
        pool_setup(args, default, library)
    args, _ = serve("--pin", "coder", "--pin", "acme/Default", "--pin", "acme/Two",
                    "--model-pool", "2")
    with pytest.raises(PoolError, match="3 pinned models need --model-pool 3"):
        pool_setup(args, default, library)
    args, _ = serve("--pin", "acme/Default")  # the default alone fits one engine
    assert pool_setup(args, default, library)[0] == (default,)


def test_models_listing_shows_downloads_and_aliases():
    from mlxbun_core.library import downloads
    from mlxbun_core.library.listing import with_states

    rows = [{"id": "a/served", "object": "model"}, {"id": "b/disk", "object": "model"}]
    downloads.set_downloading("c/new", {"bytes": 10, "total": 100})
    provider = lambda: {"d/other": {"bytes": 1}}  # noqa: E731
    downloads.add_provider(provider)
    try:
        out = with_states(rows, {"fast": "a/served", "gone": "x/none"}, 0)
    finally:
        downloads.clear_downloading("c/new")
        downloads.remove_provider(provider)
    by_id = {r["id"]: r for r in out}
    assert [by_id[i]["state"] for i in ("a/served", "b/disk", "c/new", "d/other")] == [
        "resident", "on_disk", "downloading", "downloading"]
    assert by_id["c/new"]["download"] == {"bytes": 10, "total": 100}
    assert by_id["fast"]["alias_of"] == "a/served" and by_id["fast"]["state"] == "resident"
    assert by_id["gone"]["state"] == "missing"
    only = with_states(rows, {"fast": "a/served"}, 0, allowed=lambda i: i != "b/disk")
    assert "b/disk" not in {r["id"] for r in only}
    assert with_states(rows, {}, 0) and not downloads.downloading()


def test_parse_config_show_subcommand_takes_serve_flags():
    args = cli.build_parser().parse_args(["config", "show", "--port", "1"])
    assert isinstance(args, argparse.Namespace) and args.serve_args == ["--port", "1"]


def test_the_documented_sample_is_a_valid_config(home):
    from pathlib import Path

    sample = Path(__file__).parent.parent / "docs" / "examples" / "mlxbun.yaml"
    args, s = serve("--config", str(sample))
    assert (args.isolate, args.model_pool, args.keep_alive) == (True, 3, 600.0)
    assert args.pins == ["coder"] and args.positional is None and args.model == (
        "mlx-community/Qwen3-Coder-30B-A3B-Instruct-4bit")
    assert s.model("SmolLM2-135M-Instruct").sampling == {"temperature": 0.0}


def test_in_process_server_lists_aliases_and_applies_model_settings(home, tmp_path):
    """The in-process path: `apply_model_settings` on a real engine, the template defaults
    merged under the request's own kwargs, aliases and states in /v1/models."""
    import httpx
    import openai

    from mlxbun_core.testing.checkpoints import tiny_checkpoint
    from mlxbun_core.testing.server import start_server

    template = ("{%- if persona %}{{- persona + '\\n' }}{%- endif %}"
                "{%- for m in messages %}{{- m['role'] + ': ' + m['content'] + '\\n' }}"
                "{%- endfor %}{{- 'assistant: ' }}")
    ckpt = tiny_checkpoint("llama", seed=31, chat_template=template)
    (home / "mlxbun.yaml").write_text(
        f"aliases:\n  fast: {ckpt.name}\nmodels:\n  fast:\n    max_tokens: 1\n"
        "    chat_template_kwargs: {persona: a persona of several words for the prompt}\n")
    args, settings = serve(str(ckpt))
    s = start_server(ckpt)
    try:
        assert s.engine.model.id == ckpt.name  # a directory's id is its name
        s.server.config.app.state.model_aliases = settings.aliases  # as serve_forever does
        assert apply_model_settings(s.engine, args)["max_tokens"] == 1
        client = openai.OpenAI(base_url=s.v1, api_key="unused", max_retries=0)

        def chat(**extra):
            return client.chat.completions.create(
                model="fast", messages=[{"role": "user", "content": "hi"}], **extra).usage

        usage = chat()
        assert usage.completion_tokens == 1  # the model's max_tokens: the request sent none
        assert chat(max_tokens=2, extra_body={"chat_template_kwargs": {"persona": ""}}
                    ).prompt_tokens < usage.prompt_tokens
        rows = httpx.get(s.v1 + "/models", timeout=30).json()["data"]
        assert rows[0]["state"] == "resident"
        assert rows[0]["gen_defaults"]["max_tokens"] == 1  # the cap a request gets by default
        alias = next(r for r in rows if r["id"] == "fast")
        assert alias["alias_of"] == s.engine.model.id and alias["state"] == "resident"
        assert httpx.get(s.v1 + "/models/fast", timeout=30).json()["alias_of"] == (
            s.engine.model.id)
    finally:
        s.stop()
