"""``--context-length N`` (and ``context_length:`` per model in mlxbun.yaml): a window below
the trained one caps; past it, RoPE is stretched through mlx-lm's own ``rope_scaling``
(YaRN on a config without scaling, the config's own kind otherwise) where the
architecture honours it, and refused with the reason where it does not. The served window
shows in ``/v1/models``, ``/stats``, ``/fit`` and admission; a prompt over it is a 400
naming both numbers (and the flag) on every surface, with a log line."""

from __future__ import annotations

import logging
import random
import subprocess
import sys

import anthropic
import httpx
import mlx.core as mx
import openai
import pytest
from mlx_lm import load as mlx_load
from mlx_lm.generate import generate_step

from mlxbun_core.config import apply_config
from mlxbun_core.config.permodel import context_length
from mlxbun_core.model import LoadOptions
from mlxbun_core.models.paths import DEFAULT_CONTEXT_LENGTH, DEFAULT_MODEL_ID
from mlxbun_core.models.window import WindowUnsupported, plan_window
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.families import family_config
from mlxbun_core.testing.server import start_server

NATIVE, WINDOW = 512, 2048


def config_of(model_type: str, **overrides) -> dict:
    return {**family_config(model_type), "vocab_size": 1024, **overrides}


# ------------------------------------------------------------------ the plan, per config

def test_below_the_trained_window_it_caps_without_touching_the_model():
    plan = plan_window(config_of("qwen2", max_position_embeddings=NATIVE), 300)
    assert (plan.native, plan.window, plan.rope, plan.overrides) == (NATIVE, 300, None, {})


def test_past_it_a_config_without_scaling_gets_yarn_without_temperature():
    plan = plan_window(config_of("qwen2", max_position_embeddings=NATIVE), WINDOW)
    assert plan.rope["rope_type"] == "yarn" and plan.rope["factor"] == 4.0
    assert plan.rope["mscale"] == plan.rope["mscale_all_dim"] == 0.0
    assert plan.rope["original_max_position_embeddings"] == NATIVE
    assert plan.overrides["max_position_embeddings"] == WINDOW


def test_a_config_that_scales_already_keeps_its_kind_with_a_bigger_factor():
    llama = config_of("llama")  # llama3 scaling x32 over 8192, 131072 trained
    plan = plan_window(llama, 4 * 131072)
    assert plan.rope["rope_type"] == "llama3" and plan.rope["factor"] == 128.0
    assert plan.rope["original_max_position_embeddings"] == 8192


@pytest.mark.parametrize("config,words", [
    (config_of("gemma4_text"),
     r"code ignores rope_scaling \(tried 'yarn', 'llama3', 'linear'\)"),
    (config_of("gemma3_text", num_hidden_layers=2, sliding_window_pattern=6),
     "every attention layer of 'gemma3_text' is a sliding window"),
    ({"model_type": "mamba", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
      "state_size": 8, "num_hidden_layers": 1, "conv_kernel": 4, "use_bias": False,
      "use_conv_bias": True, "time_step_rank": 4, "max_position_embeddings": 2048},
     "no rotary position embedding"),
    (config_of("qwen2", rope_scaling={"rope_type": "longrope", "factor": 2.0}),
     "already scales RoPE with 'longrope'"),
    ({"model_type": "llama"}, "states no trained window"),
], ids=["ignores-rope-scaling", "sliding-window-only", "recurrent", "longrope", "no-window"])
def test_what_cannot_be_stretched_is_refused_with_the_reason(config, words):
    with pytest.raises(WindowUnsupported, match=words):
        plan_window(config, 10**6)


def test_mlxbun_yaml_per_model_loses_to_the_flag_and_the_default_model_gets_32k(
        tmp_path, monkeypatch):
    from mlxbun_core import cli

    for var in ("MLXBUN_CONTEXT_LENGTH", "MLXBUN_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MLXBUN_HOME", str(tmp_path))
    (tmp_path / "mlxbun.yaml").write_text(
        "serve:\n  context-length: 4096\nmodels:\n  acme/Tiny:\n    context_length: 65536\n")

    def asked(*flags, model="acme/Tiny"):
        argv = ["serve", *flags]
        args = cli.build_parser().parse_args(argv)
        apply_config(args, argv, cli.build_serve_parser)
        return context_length(args, model)

    assert asked() == 65536  # the model's entry beats the file's serve: section
    assert asked(model="other") == 4096
    assert asked("--context-length", "1000") == 1000  # a flag beats both
    monkeypatch.setenv("MLXBUN_CONTEXT_LENGTH", "2000")
    assert asked() == 2000
    monkeypatch.delenv("MLXBUN_CONTEXT_LENGTH")
    (tmp_path / "mlxbun.yaml").write_text("models:\n  acme/Tiny:\n    context_length: -1\n")
    with pytest.raises(Exception, match="context_length must be a positive integer"):
        asked()
    (tmp_path / "mlxbun.yaml").unlink()
    assert asked(model=DEFAULT_MODEL_ID) == DEFAULT_CONTEXT_LENGTH == 32768
    assert asked("--context-length", "8192", model=DEFAULT_MODEL_ID) == 8192
    assert asked(model="acme/Tiny") is None  # the checkpoint's own


# ------------------------------------------------------------------ a served stretch

@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("qwen2", seed=21, config_overrides={"max_position_embeddings": NATIVE})


@pytest.fixture(scope="module")
def srv(ckpt):
    s = start_server(ckpt, options=LoadOptions(context_length=WINDOW))
    yield s
    s.stop()


def text_of(tok, n: int, seed: int = 0) -> str:
    """A varied completion prompt of about ``n`` tokens (the tiny vocabulary's words)."""
    rng = random.Random(seed)
    words = [w for w in tok.get_vocab() if w.isalpha() and len(w) > 2][:200]
    text = ""
    while len(tok.encode(text)) < n:
        text += " ".join(rng.choice(words) for _ in range(20)) + " "
    return text


def greedy(srv, prompt: str, n: int = 12) -> list[tuple[int, float]]:
    """The served greedy tokens and their log-probs."""
    r = httpx.post(srv.v1 + "/completions", timeout=300, json={
        "prompt": prompt, "max_tokens": n, "temperature": 0, "logprobs": True})
    assert r.status_code == 200, r.text
    return [(e["id"], e["logprob"]) for e in r.json()["choices"][0]["logprobs"]["content"]]


def mlx_lm_greedy(model, tok, prompt: str, n: int = 12) -> list[tuple[int, float]]:
    out = []
    for t, lp in generate_step(mx.array(tok.encode(prompt)), model, max_tokens=n):
        out.append((int(t), float(lp[t])))
        if t in tok.eos_token_ids:
            break
    return out


def test_every_report_says_the_served_window(srv):
    row = httpx.get(srv.v1 + "/models").json()["data"][0]
    assert (row["context_window"], row["native_context_window"]) == (WINDOW, NATIVE)
    assert row["rope_scaling"]["rope_type"] == "yarn" and row["rope_scaling"]["factor"] == 4.0
    admission = httpx.get(srv.base_url + "/stats").json()["admission"]
    assert admission["enforced_context_tokens"] == WINDOW == admission["max_safe_context"]
    fit = httpx.get(srv.base_url + "/fit").json()
    assert fit["context_tokens"] == WINDOW and fit["report"]["max_safe_context"] == WINDOW


def test_a_prompt_past_the_trained_window_is_served_as_mlx_lm_serves_the_same_config(srv, ckpt):
    """Parity: mlx-lm's own generate_step on the config the flag writes gives the same
    greedy tokens and log-probs; on the unstretched config, other log-probs (the
    stretch is real)."""
    tok = srv.engine.model.tokenizer
    prompt = text_of(tok, 3 * NATIVE // 2)
    ours = greedy(srv, prompt)
    rope = httpx.get(srv.v1 + "/models").json()["data"][0]["rope_scaling"]
    model, ref_tok = mlx_load(str(ckpt), model_config={"rope_scaling": rope,
                                                       "max_position_embeddings": WINDOW})
    ref = mlx_lm_greedy(model, ref_tok, prompt)
    assert [t for t, _ in ours] == [t for t, _ in ref]
    assert [lp for _, lp in ours] == pytest.approx([lp for _, lp in ref], abs=1e-3)
    native, _ = mlx_load(str(ckpt))
    plain = mlx_lm_greedy(native, ref_tok, prompt)
    assert [lp for _, lp in plain] != pytest.approx([lp for _, lp in ours], abs=1e-3)


def test_a_prompt_over_the_window_is_a_400_naming_both_numbers_on_every_surface(srv, caplog):
    tok = srv.engine.model.tokenizer
    prompt = text_of(tok, WINDOW + 50, seed=1)
    n = len(tok.encode(prompt))
    caplog.set_level(logging.INFO, logger="mlxbun.admission")
    oai = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        oai.completions.create(model="m", prompt=prompt, max_tokens=4)
    message = err.value.body["message"]
    assert f"prompt has {n} tokens" in message and f"at most {WINDOW} tokens" in message
    assert "--context-length" in message
    with pytest.raises(openai.BadRequestError) as err:
        oai.responses.create(model="m", input=prompt, max_output_tokens=16)
    assert f"at most {WINDOW} tokens" in err.value.body["message"]
    assert "--context-length" in err.value.body["message"]
    claude = anthropic.Anthropic(base_url=srv.base_url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(model="m", max_tokens=4,
                               messages=[{"role": "user", "content": prompt}])
    said = err.value.body["error"]["message"]
    tokens, limit = said.removeprefix("prompt is too long: ").split(" maximum")[0].split(
        " tokens > ")  # the form Claude Code parses, then the flag
    assert int(tokens) > WINDOW and int(limit) == WINDOW and "--context-length" in said
    refusals = [r.getMessage() for r in caplog.records if r.name == "mlxbun.admission"]
    assert len(refusals) == 3 and f"prompt of {n} tokens: over the {WINDOW}" in refusals[0]
    assert greedy(srv, "still serving after the refusals", 2)


def test_serve_refuses_at_start_what_the_architecture_cannot_stretch(tmp_path):
    """Before any weight is read: the exit status 2 and the reason on stderr."""
    gemma = tiny_checkpoint("gemma4_text", seed=5)
    done = subprocess.run([sys.executable, "-m", "mlxbun_core.cli", "serve", str(gemma),
                           "--context-length", "1000000", "--port", "0", "--no-open"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--context-length 1000000: cannot serve gemma4_text so" in done.stderr
    assert "code ignores rope_scaling" in done.stderr and "Traceback" not in done.stderr


def test_the_embedded_default_stretched_to_32k_answers_as_mlx_lm_does(smollm2_path):
    """The real SmolLM2-135M with the window it is served with by default: greedy tokens
    and log-probs equal mlx-lm's on the same overridden config, and the answer is right."""
    s = start_server(smollm2_path, options=LoadOptions(context_length=DEFAULT_CONTEXT_LENGTH))
    try:
        tok = s.engine.model.tokenizer
        prompt = tok.apply_chat_template([{"role": "user", "content":
                                           "What is the capital of France?"}],
                                         add_generation_prompt=True, tokenize=False)
        ours = greedy(s, prompt, 10)
        rope = s.engine.model.extras["rope_scaling"]
    finally:
        s.stop()
    assert tok.decode([t for t, _ in ours]).startswith("The capital of France is Paris")
    model, ref_tok = mlx_load(str(smollm2_path), model_config={
        "rope_scaling": rope, "max_position_embeddings": DEFAULT_CONTEXT_LENGTH})
    ref = mlx_lm_greedy(model, ref_tok, prompt, 10)
    assert [t for t, _ in ours] == [t for t, _ in ref]
    assert [lp for _, lp in ours] == pytest.approx([lp for _, lp in ref], abs=1e-3)


def test_a_plugin_that_loads_the_model_itself_without_the_stretch_is_refused(ckpt):
    """A family whose load_model ignores ``options.extra["window"]`` would serve the
    trained RoPE under a stretched window: the loader refuses it, naming the plugin."""
    from pathlib import Path

    from mlxbun_core import loader, plugins
    from mlxbun_core.hookspecs import hookimpl
    from mlxbun_core.model import LoadedModel

    class OwnLoader:
        @hookimpl(tryfirst=True)
        def claims(self, path):
            return "own-loader" if Path(path) == ckpt else None

        @hookimpl
        def load_model(self, path, config, options):
            model, tok = mlx_load(str(path))
            return LoadedModel(id="own", path=Path(path), config=config, model=model,
                               tokenizer=tok)

    plugins.register(OwnLoader(), "own-loader")
    try:
        with pytest.raises(WindowUnsupported, match="plugin 'own-loader' loads 'own-loader' "
                                                    "models itself and did not apply"):
            loader.claim(ckpt, LoadOptions(model_id="own", context_length=WINDOW))
        capped = loader.claim(ckpt, LoadOptions(model_id="own", context_length=NATIVE // 2))
        assert capped.context_window == NATIVE // 2  # a cap needs nothing of the plugin
    finally:
        plugins.unregister("own-loader")
