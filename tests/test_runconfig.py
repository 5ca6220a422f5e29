"""The run configuration (``mlxbun_core/runconfig.py``): one typed, frozen object built at
start-up from flags > environment > file > defaults, read below start-up instead of the
environment, and reported by ``mlxbun config show``."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mlxbun_core import cli, runconfig
from mlxbun_core.config import apply_config
from mlxbun_core.config.runtime import build
from mlxbun_core.engine import prefill_shapes
from mlxbun_core.engine.fill import FillPolicy
from mlxbun_core.engine.memory import MemoryConfig
from mlxbun_core.testing.helpers import configure


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A clean $MLXBUN_HOME and no MLXBUN_* variables."""
    import os

    for var in [v for v in os.environ if v.startswith(("MLXBUN_", "MLX_BUN_"))]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("MLXBUN_HOME", str(tmp_path))
    return tmp_path


def serve(*flags):
    argv = ["serve", *flags]
    args = cli.build_parser().parse_args(argv)
    apply_config(args, argv, cli.build_serve_parser)
    return args


def test_every_group_is_frozen_and_every_field_names_its_variable():
    config = runconfig.RunConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.engine.fill = "strict"  # type: ignore[misc]
    names = runconfig.env_names()
    assert len(names) == sum(len(v) for v in config.as_dict().values())
    assert all(v.startswith("MLXBUN_") for v in names.values())


def test_the_environment_is_read_into_typed_fields():
    env = {"MLXBUN_FILL": "on", "MLX_BUN_FILL_MAX_SPAN": "1", "MLXBUN_FILL_BATCH_TOKENS": "0",
           "MLXBUN_SHORT_ATTENTION": "yes", "MLXBUN_SPEC_BATCH_REFEED": "0",
           "MLXBUN_SSD_WRITEBEHIND": "off", "MLXBUN_SSD_READ_GBS": "fast",
           "MLXBUN_FAULT_ALLOC": "7", "MLXBUN_FAULT_DEVICE": "x",
           "MLXBUN_MAX_BODY_BYTES": "0", "MLXBUN_SHUTDOWN_TIMEOUT": "2.5"}
    c = runconfig.from_environ(env)
    assert (c.engine.fill, c.engine.fill_max_span, c.engine.fill_batch_tokens) == \
        ("strict", 2, 0)  # the old spelling still read; a span is at least 2
    assert (c.engine.short_attention, c.engine.prefill_buckets) == ("on", "auto")
    assert (c.speculation.batch_refeed, c.speculation.batch_positions) == (1, None)
    assert (c.cache.ssd_write_behind, c.cache.ssd_read_gbs) == (False, None)
    assert (c.faults.alloc, c.faults.device) == (7, 0)
    assert (c.server.max_body_bytes, c.server.shutdown_timeout) == (None, 2.5)
    with pytest.raises(ValueError, match="MLXBUN_SHORT_ATTENTION"):
        runconfig.from_environ({"MLXBUN_SHORT_ATTENTION": "sometimes"})


def test_a_flag_wins_over_its_variable_and_the_variable_over_the_default(home, monkeypatch):
    monkeypatch.setenv("MLXBUN_FILL", "strict")
    monkeypatch.setenv("MLXBUN_PREFILL_BUCKETS", "on")
    monkeypatch.setenv("MLXBUN_SPEC_BATCH_POSITIONS", "9")
    config = build(serve("--fill", "off"))
    assert config.engine.fill == "off"  # the flag
    assert config.engine.prefill_buckets == "on"  # the variable, through the flag's default
    assert config.speculation.batch_positions == 9  # a variable with no flag
    assert build(serve()).engine.fill == "strict"
    (home / "mlxbun.yaml").write_text("serve:\n  fill: strict\n  keep_volatile_system: true\n")
    monkeypatch.delenv("MLXBUN_FILL")
    from_file = build(serve())
    assert from_file.engine.fill == "strict" and from_file.server.keep_volatile_system


def test_code_below_start_up_reads_the_installed_object_not_the_environment(monkeypatch):
    configure(monkeypatch, engine={"prefill_buckets": "on", "fill": "strict"},
              faults={"alloc": 3})
    monkeypatch.setenv("MLXBUN_PREFILL_BUCKETS", "off")  # after start-up: changes nothing
    monkeypatch.setenv("MLXBUN_FILL", "off")
    assert prefill_shapes.enabled() and prefill_shapes.pieces(5) == [4, 1]
    assert FillPolicy.resolve().mode == "strict"
    assert MemoryConfig.from_config().fault_alloc == 3
    with runconfig.overridden(engine={"prefill_buckets": "off"}):
        assert not prefill_shapes.enabled()
    assert prefill_shapes.enabled()


def test_config_show_reports_the_same_object(home, capsys, monkeypatch):
    monkeypatch.setenv("MLXBUN_FILL_BATCH_TOKENS", "64")
    assert cli.main(["config", "show", "--json", "--prefill-buckets", "on"]) == 0
    report = json.loads(capsys.readouterr().out)
    runtime = report["runtime"]
    built = json.loads(json.dumps(build(serve("--prefill-buckets", "on")).as_dict()))
    assert {g: {k: row["value"] for k, row in rows.items()} for g, rows in runtime.items()} \
        == built
    assert runtime["engine"]["prefill_buckets"] == {"value": "on", "source": "flag"}
    assert runtime["engine"]["fill_batch_tokens"] == {
        "value": 64, "source": "env MLXBUN_FILL_BATCH_TOKENS"}
    assert runtime["engine"]["short_attention"] == {"value": "auto", "source": "default"}
    monkeypatch.setenv("MLXBUN_SHORT_ATTENTION", "sometimes")
    assert cli.main(["config", "show"]) == 2
    assert "MLXBUN_SHORT_ATTENTION" in capsys.readouterr().err


def test_the_settings_moved_from_their_modules_are_read_into_fields():
    """Grammar, model-file, hub and family settings that their modules used to read from
    the environment themselves."""
    env = {"MLXBUN_ADAPTER_MIXING": "off", "MLX_BUN_GRAMMAR": "0",
           "MLXBUN_GRAMMAR_BACKEND": " xgrammar ", "MLXBUN_GRAMMAR_THREADS": "0",
           "MLXBUN_CONVERT_PRECISION": " Q4 ", "MLXBUN_HUB_TIMEOUT": "-1",
           "MLXBUN_BANDWIDTH_GBS": "fast", "MLXBUN_MTP_HIDDEN": "post",
           "MLXBUN_EXPERT_READERS": "2", "MLXBUN_EXPERT_PREFETCH": "off"}
    c = runconfig.from_environ(env)
    assert c.engine.adapter_mixing is False
    assert (c.grammar.enabled, c.grammar.backend, c.grammar.threads) == (False, "xgrammar", 1)
    assert (c.models.convert_precision, c.models.hub_timeout, c.models.bandwidth_gbs) == \
        ("q4", None, None)  # a timeout that is no positive number and a bandwidth no number
    assert (c.families.mtp_hidden, c.families.expert_readers,
            c.families.expert_prefetch) == ("post", 2, False)
    defaults = runconfig.from_environ({})
    assert (defaults.engine.adapter_mixing, defaults.grammar.enabled,
            defaults.families.expert_prefetch) == (True, True, True)


def test_the_moved_settings_are_what_their_modules_use(monkeypatch):
    """Each module reads its field, not the environment: a variable set after start-up
    changes nothing, the configuration does."""
    from mlxbun_core.grammar_registry import GrammarRegistry, grammar_disabled
    from mlxbun_core.library.bandwidth import decode_bandwidth
    from mlxbun_core.models import gguf_cache, hub_timeout

    configure(monkeypatch)  # the configuration as it stands, installed for this test
    monkeypatch.setenv("MLXBUN_HUB_TIMEOUT", "2")
    monkeypatch.setenv("MLXBUN_GRAMMAR", "0")
    assert hub_timeout.seconds() == hub_timeout.DEFAULT_S and not grammar_disabled()
    configure(monkeypatch, models={"hub_timeout": 2.0, "convert_precision": "bfloat16",
                                   "bandwidth_gbs": 123.0},
              grammar={"enabled": False, "backend": "xgrammar"})
    assert hub_timeout.seconds() == 2.0 and grammar_disabled()
    assert GrammarRegistry(load_plugins=False).selected == "xgrammar"
    assert gguf_cache.stored_precision("Q4_K", gpu=False) == "bfloat16"
    assert decode_bandwidth("cpu", "x", probe_mlx=False).gbs == 123.0


def test_the_process_settings_are_read_into_fields():
    """Plugins, BLAS, torch, the browser, the default model and private media: settings
    their modules used to read from the environment themselves."""
    env = {"MLXBUN_PLUGINS": "qwen35, gemma4,", "MLXBUN_DISABLE_PLUGINS": "webapp",
           "MLXBUN_TRACE_HOOKS": "1", "MLXBUN_BLAS": " reference ", "MLXBUN_TORCH": "1",
           "MLXBUN_BLAS_THREADS": "3", "OPENBLAS_NUM_THREADS": "8",
           "MLXBUN_DEFAULT_MODEL": "Auto", "MLXBUN_ALLOW_PRIVATE_MEDIA": "yes",
           "MLXBUN_NO_OPEN": "0", "CI": "true"}
    c = runconfig.from_environ(env)
    p = c.process
    assert (p.plugins, p.disable_plugins, p.trace_hooks) == (("qwen35", "gemma4"),
                                                             ("webapp",), True)
    assert (p.blas, p.blas_threads, p.torch) == ("reference", 3, True)
    assert p.no_open is False  # its own variable wins over CI
    assert (c.models.default_model, c.server.allow_private_media) == ("auto", True)
    others = runconfig.from_environ({"OPENBLAS_NUM_THREADS": "8", "CI": "1",
                                     "MLXBUN_TRACE_HOOKS": "off", "MLXBUN_TORCH": "yes"})
    assert others.process.blas_threads == 0  # OpenBLAS's own choice
    assert others.process.no_open and not others.process.trace_hooks
    assert not others.process.torch  # only 1 keeps torch, as before
    blank = runconfig.from_environ({}).process
    assert (blank.plugins, blank.disable_plugins, blank.blas, blank.blas_threads,
            blank.no_open) == (None, (), "auto", None, False)


def test_config_show_lists_the_process_settings_and_their_sources(home, capsys, monkeypatch):
    monkeypatch.setenv("MLXBUN_DEFAULT_MODEL", "auto")
    monkeypatch.setenv("MLXBUN_DISABLE_PLUGINS", "webapp,other")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")
    monkeypatch.setenv("CI", "1")
    monkeypatch.setenv("MLXBUN_ALLOW_PRIVATE_MEDIA", "1")
    assert cli.main(["config", "show", "--json"]) == 0
    runtime = json.loads(capsys.readouterr().out)["runtime"]
    assert runtime["models"]["default_model"] == {"value": "auto",
                                                  "source": "env MLXBUN_DEFAULT_MODEL"}
    assert runtime["process"]["disable_plugins"] == {
        "value": ["webapp", "other"], "source": "env MLXBUN_DISABLE_PLUGINS"}
    assert runtime["process"]["blas_threads"] == {"value": 0,
                                                  "source": "env OPENBLAS_NUM_THREADS"}
    assert runtime["process"]["no_open"] == {"value": True, "source": "env CI"}
    assert runtime["process"]["blas"] == {"value": "auto", "source": "default"}
    assert runtime["server"]["allow_private_media"] == {
        "value": True, "source": "env MLXBUN_ALLOW_PRIVATE_MEDIA"}
    monkeypatch.delenv("MLXBUN_ALLOW_PRIVATE_MEDIA")
    monkeypatch.delenv("CI")
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    (home / "mlxbun.yaml").write_text("serve:\n  allow_private_media: true\n")
    assert cli.main(["config", "show", "--json", "--no-open"]) == 0
    runtime = json.loads(capsys.readouterr().out)["runtime"]
    assert runtime["server"]["allow_private_media"]["value"] is True
    assert runtime["server"]["allow_private_media"]["source"].startswith("file:")
    assert runtime["process"]["no_open"] == {"value": True, "source": "flag"}
    assert build(serve()).process.no_open is False
    assert build(serve()).server.allow_private_media is True  # from the file


def test_the_process_settings_are_what_their_modules_use(monkeypatch):
    """Plugins, BLAS threads, the browser, the fetch policy and the default model read
    their fields: a variable set after start-up changes nothing, the configuration does."""
    import argparse

    from mlxbun_core import plugins, selection
    from mlxbun_core.blas import route
    from mlxbun_core.media import fetch
    from mlxbun_core.webapp import pages

    configure(monkeypatch, process={"disable_plugins": ("gemma4",), "plugins": ("qwen35",),
                                    "no_open": True},
              server={"allow_private_media": True}, models={"default_model": "embedded"})
    monkeypatch.setenv("MLXBUN_DISABLE_PLUGINS", "")
    monkeypatch.setenv("MLXBUN_NO_OPEN", "0")
    monkeypatch.setattr(fetch.policy, "allow_private", None)
    assert [plugins._wanted(n) for n in ("qwen35", "gemma4", "llama")] == [True, False, False]
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    assert not pages.interactive_start(no_open=False)
    assert fetch.policy.private_allowed()
    assert (route.default_threads(5), route.default_threads(0)) == (5, None)
    assert route.default_threads(None) >= 1
    monkeypatch.setattr(selection, "embedded_default_available", lambda: True)
    monkeypatch.setenv("MLXBUN_DEFAULT_MODEL", "auto")
    nothing = argparse.Namespace(model=None, positional=None, query=None)
    assert selection.chosen_model(nothing) is None  # the embedded default, not a pick
    configure(monkeypatch, process={"no_open": False}, server={"allow_private_media": False})
    assert pages.interactive_start(no_open=False) and not fetch.policy.private_allowed()


def test_serve_start_sets_the_thread_switch_interval(home, monkeypatch):
    """How long the worker, its pass's result ready, may wait for the event loop's thread
    to let go of the GIL: ``MLXBUN_SWITCH_INTERVAL_MS``, set once at start-up."""
    import sys

    from mlxbun_core.startup import configure_run

    monkeypatch.setattr(runconfig, "_installed", runconfig.current())  # (restored after)
    was = sys.getswitchinterval()
    try:
        monkeypatch.setenv("MLXBUN_SWITCH_INTERVAL_MS", "0.5")
        configure_run(serve())
        assert runconfig.current().engine.switch_interval_ms == 0.5
        assert sys.getswitchinterval() == pytest.approx(0.0005)
        for wrong in ("-1", "0", "fast"):  # ignored (with a warning): Python's own
            assert runconfig.from_environ({"MLXBUN_SWITCH_INTERVAL_MS": wrong}).engine \
                .switch_interval_ms is None
        monkeypatch.delenv("MLXBUN_SWITCH_INTERVAL_MS")
        sys.setswitchinterval(0.005)
        configure_run(serve())  # unset: Python's own stays
        assert sys.getswitchinterval() == pytest.approx(0.005)
    finally:
        sys.setswitchinterval(was)
