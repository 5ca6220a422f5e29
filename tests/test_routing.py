"""The core routes per-model hooks to the plugin that claimed the model.

A family plugin never checks "is this model mine?": after ``claims`` names a family,
``model.hooks`` asks that family, extensions and the generic fallback, never another
family. These tests register plugins that would take over every model if it did.
"""

import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from mlxbun_qwen35 import fallback_template

from mlxbun_core import loader, plugins
from mlxbun_core.contract import ToolParser
from mlxbun_core.hookspecs import hookimpl
from mlxbun_core.model import DraftModel, LoadedModel, LoadOptions, Prompt
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.families import family_config
from mlxbun_core.testing.server import start_server
from mlxbun_core.toolcalls import Dialect, StreamingToolParser

MSG = [{"role": "user", "content": "Weather in Paris?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}}}}]
QWEN_CALL = ("Let me check.<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
             "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")


class NeverMarkup(Dialect):
    """Every byte is content: a parser that would swallow another family's tool calls."""


class Rogue:
    """A family that forgot every guard: it answers every hook for every model, first."""

    FAMILY = "rogue"

    def __init__(self, own: Path):
        self.own = own.resolve()
        self.asked: list[str] = []

    @hookimpl(tryfirst=True)
    def claims(self, path):
        return self.FAMILY if Path(path).resolve() == self.own else None

    @hookimpl(tryfirst=True)
    def load_model(self, path, config, options):
        self.asked.append("load_model")
        raise AssertionError("the rogue was asked to load a checkpoint it did not claim")

    @hookimpl(tryfirst=True)
    def render_chat(self, model):
        self.asked.append("render_chat")
        return Prompt(tokens=[0, 1], text="ROGUE")

    @hookimpl(tryfirst=True)
    def tool_call_parser(self, tools):
        self.asked.append("tool_call_parser")
        return StreamingToolParser(NeverMarkup(), tools)

    @hookimpl(tryfirst=True)
    def media_pipeline(self, kind):
        self.asked.append("media_pipeline")
        return object()

    @hookimpl(tryfirst=True)
    def draft_source(self, model):
        self.asked.append("draft_source")
        return DraftModel(model=None, num_draft_tokens=9, name="rogue")

    @hookimpl(tryfirst=True)
    def embed(self, texts):
        self.asked.append("embed")
        return [[1.0] for _ in texts], 0


@pytest.fixture
def registered():
    """Register plugin objects for one test; unregister them after."""
    names = []

    def add(plugin, name):
        plugins.register(plugin, name)
        names.append(name)
        return plugin

    yield add
    for name in names:
        plugins.unregister(name)


def config_dir(root: Path, name: str, config: dict, **files) -> Path:
    """A checkpoint directory with a config.json and no weights at all."""
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config))
    for fname, text in files.items():
        (d / fname).write_text(text)
    return d


def call_order(caller) -> list[str]:
    return [i.plugin_name for i in reversed(caller.get_hookimpls())]


# -- the rogue plugin ---------------------------------------------------------------

@pytest.fixture(scope="module")
def qwen_ckpt():
    return tiny_checkpoint("qwen3_5", seed=7, chat_template=fallback_template())


def chat(srv) -> dict:
    client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    r = client.chat.completions.create(
        model="m", messages=MSG, tools=TOOLS, temperature=0, max_tokens=12,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    msg = r.choices[0].message
    return {"content": msg.content, "tool_calls": msg.tool_calls,
            "prompt_tokens": r.usage.prompt_tokens, "completion_tokens": r.usage.completion_tokens}


def observe(model) -> dict:
    """What the model's hooks answer: its prompt, its tool calls, its extras."""
    prompt = model.hooks.render_chat(model=model, messages=MSG, tools=TOOLS, template_kwargs={},
                                     reasoning_effort=None)
    parser = model.hooks.tool_call_parser(model=model, tools=TOOLS)
    assert isinstance(parser, ToolParser)
    parser.feed(QWEN_CALL)
    parser.finish()
    return {"prompt": prompt.text, "calls": [(c.name, c.args) for c in parser.calls],
            "media": model.hooks.media_pipeline(model=model, kind="image"),
            "draft": model.hooks.draft_source(model=model, options=LoadOptions()),
            "embed": model.hooks.embed(model=model, texts=["a"], instruction=None)}


def test_rogue_family_does_not_change_another_familys_prompt_calls_or_output(
        qwen_ckpt, tmp_path, registered):
    srv = start_server(qwen_ckpt)
    try:
        before, before_reply = observe(srv.engine.model), chat(srv)
        assert before["calls"] == [("get_weather", {"city": "Paris", "days": 3})]
        rogue = registered(Rogue(config_dir(tmp_path, "rogue", {"model_type": "llama"})),
                           "rogue-test")
        # the model already being served: its relay notices the new plugin
        assert observe(srv.engine.model) == before
        assert chat(srv) == before_reply
    finally:
        srv.stop()
    # a model loaded while the rogue is registered: claimed and served as before
    srv = start_server(qwen_ckpt)
    try:
        model = srv.engine.model
        assert (model.family, model.plugin) == ("qwen35", "qwen35")
        assert srv.engine.draft is None
        assert observe(model) == before
        assert chat(srv) == before_reply
    finally:
        srv.stop()
    assert rogue.asked == []
    # the rogue is live: for the checkpoint it claims, its answers are the ones used
    claim = loader.identify(rogue.own)
    assert claim == loader.Claim("rogue", "rogue-test")
    own = LoadedModel(id="r", path=rogue.own, config={}, model=None, tokenizer=None,
                      family=claim.family, plugin=claim.plugin)
    assert own.hooks.render_chat(model=own, messages=MSG, tools=None, template_kwargs={},
                                 reasoning_effort=None).text == "ROGUE"
    assert rogue.asked == ["render_chat"]


def test_rogue_does_not_reach_generic_or_embedding_models(tmp_path, registered):
    chatml = tiny_checkpoint("qwen3", seed=11)
    generic = loader.claim(chatml, LoadOptions(model_id="chat"))
    before = observe(generic)
    rogue = registered(Rogue(tmp_path), "rogue-test")
    assert generic.family == "generic" and observe(generic) == before
    assert before["embed"] is None and before["media"] is None and before["draft"] is None
    emb = loader.claim(chatml, LoadOptions(model_id="x", embedding=True))
    vectors, used = emb.hooks.embed(model=emb, texts=["hello"], instruction=None)
    assert emb.family == "qwen3_embed" and len(vectors[0]) == 64 and used > 1
    assert rogue.asked == []


# -- the relay ----------------------------------------------------------------------

class Extension:
    """Not a family: answers shared per-model hooks for whatever model is loaded."""

    @hookimpl
    def media_pipeline(self, kind):
        return f"ext-{kind}"

    @hookimpl
    def draft_source(self):
        return None


def bare(family: str, plugin: str) -> LoadedModel:
    return LoadedModel(id=family, path=Path("."), config={}, model=None, tokenizer=None,
                       family=family, plugin=plugin)


def test_relay_asks_the_claimant_then_generic_and_keeps_extensions(registered):
    registered(Extension(), "ext-test")
    qwen, generic = bare("qwen35", "qwen35"), bare("generic", "generic")
    assert call_order(qwen.hooks.render_chat) == ["qwen35", "generic"]
    assert call_order(qwen.hooks.load_model) == ["qwen35"]  # generic never loads for a family
    assert call_order(generic.hooks.render_chat) == ["generic"]
    assert call_order(generic.hooks.load_model) == ["generic"]
    assert call_order(qwen.hooks.draft_source) == ["ext-test", "draft_model"]
    assert qwen.hooks.media_pipeline(model=qwen, kind="audio") == "ext-audio"
    assert not plugins.is_family(plugins.pm.get_plugin("ext-test"))
    # a model built by hand (no loader) is routed by its family name
    assert call_order(dataclasses.replace(qwen, plugin="").hooks.tool_call_parser) == \
        ["qwen35", "generic"]
    assert qwen.hooks is qwen.hooks  # built once per model, not per call


def test_family_without_claims_is_reported_and_never_asked(registered, caplog):
    class Legacy:  # an old-style family: guards in every hook, no claims
        @hookimpl(tryfirst=True)
        def render_chat(self, model):
            return Prompt(tokens=[0], text="LEGACY")

    with caplog.at_level(logging.WARNING, logger="mlxbun.plugins"):
        registered(Legacy(), "legacy-test")
    assert "legacy-test implements render_chat but not claims" in caplog.text
    assert "legacy-test" not in call_order(bare("generic", "generic").hooks.render_chat)
    assert "legacy-test" in call_order(plugins.hook().render_chat)


# -- claiming -----------------------------------------------------------------------

class Spy:
    """A wrapper around ``claims``: sees every claim, and may overrule it."""

    def __init__(self, overrule=None):
        self.seen, self.overrule = [], overrule

    @hookimpl(wrapper=True)
    def claims(self, path):
        family = yield
        self.seen.append((Path(path).name, family))
        return self.overrule or family


def test_wrapper_sees_the_claim_and_can_overrule_it(qwen_ckpt, tmp_path, registered):
    spy = registered(Spy(), "spy-test")
    d = config_dir(tmp_path, "q", family_config("qwen3_5"))
    assert loader.identify(d) == loader.Claim("qwen35", "qwen35")
    assert spy.seen == [("q", "qwen35")] and not plugins.is_family(spy)
    plugins.unregister("spy-test")
    registered(Spy(overrule="generic"), "spy-test-2")
    model = loader.claim(qwen_ckpt, LoadOptions(model_id="q"))
    assert (model.family, model.plugin) == ("generic", "generic")
    assert call_order(model.hooks.render_chat) == ["generic"]


def test_claim_of_a_family_nobody_provides_is_a_clear_error(tmp_path, registered):
    registered(Spy(overrule="nosuchfamily"), "spy-test")
    with pytest.raises(plugins.PluginError, match="nosuchfamily"):
        loader.identify(config_dir(tmp_path, "q", family_config("qwen3_5")))


CLAIM_SCRIPT = """
import logging, sys
from pathlib import Path
logging.basicConfig(level="INFO", format="%(name)s: %(message)s")
from mlxbun_core import loader
for d in sys.argv[1:]:
    c = loader.identify(Path(d))
    print(Path(d).name, c.family if c else None)
print("imported", sorted(m for m in ("mlx_lm", "transformers", "safetensors") if m in sys.modules))
"""


def test_claims_need_no_weights_and_show_in_the_hook_trace(tmp_path):
    llama = family_config("llama")
    dirs = [
        config_dir(tmp_path, "qwen", family_config("qwen3_5")),
        config_dir(tmp_path, "gemma", family_config("gemma4")),
        config_dir(tmp_path, "glm", family_config("glm_moe_dsa")),
        config_dir(tmp_path, "MiniCPM5-1B", family_config("minicpm5")),
        config_dir(tmp_path, "llama", llama),
        config_dir(tmp_path, "mistral", {**llama, "model_type": "mistral"}),
        config_dir(tmp_path, "embed", family_config("qwen3"), **{"modules.json": "[]"}),
        config_dir(tmp_path, "chat", family_config("qwen3")),
        config_dir(tmp_path, "unknown", {"model_type": "no_such_arch"}),
    ]
    out = subprocess.run([sys.executable, "-c", CLAIM_SCRIPT, *map(str, dirs)],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "MLXBUN_TRACE_HOOKS": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "qwen qwen35", "gemma gemma4", "glm glm52", "MiniCPM5-1B minicpm5", "llama generic",
        "mistral generic", "embed qwen3_embed", "chat generic", "unknown None",
        "imported []"]
    trace = [line for line in out.stderr.splitlines() if "hook claims" in line]
    assert len(trace) == len(dirs)
    assert trace[0].endswith("-> 'qwen35'") and "'generic']" in trace[0]
    assert trace[-1].endswith("-> None")
