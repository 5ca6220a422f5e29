"""The managed pool: `serve --isolate` configured by an mlxbun.yaml in $MLXBUN_HOME, with a
real parent process, real engine children and the official SDKs as clients. Aliases route
chat requests, a pinned model survives pool pressure and keep_alive 0, an idle engine is
unloaded after its keep_alive, the allow-list refuses other models in each surface's error
shape, and /v1/models lists what may be asked for with its state."""

import json
import time

import anthropic
import httpx
import openai
import pytest

from mlxbun_core.testing.hub_cache import library_env, library_hub
from mlxbun_core.testing.process import serve

LLAMA, CODER, QWEN, OUTSIDER = ("acme/Tiny-Llama-Chat", "acme/Tiny-Coder", "other/Qwen3-Tiny",
                                "acme/Tiny-Outsider")
# a template that shows a chat_template_kwargs value in the prompt
PERSONA_TEMPLATE = (
    "{%- if persona %}{{- '<|im_start|>system\\n' + persona + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}{{- '<|im_start|>assistant\\n' }}")
MODELS = {LLAMA: ("llama", {"seed": 11}),
          CODER: ("llama", {"seed": 21, "chat_template": PERSONA_TEMPLATE}),
          QWEN: ("qwen3", {"seed": 13}),
          OUTSIDER: ("llama", {"seed": 22})}
CONFIG = f"""
serve:
  model: {LLAMA}
  isolate: true
  model-pool: 2
  pin: [tiny]
  allow_models: [coder, ghost/Not-Here]
aliases:
  coder: {CODER}
  tiny: {QWEN}
models:
  coder:
    max_tokens: 2
    chat_template_kwargs:
      persona: you are a careful assistant who writes small, well tested functions
"""


class Parent:
    def __init__(self, server):
        self.server, self.proc, self.base = server, server.proc, server.base
        self.openai = openai.OpenAI(base_url=self.base + "/v1", api_key="unused",
                                    max_retries=0, timeout=120)
        self.anthropic = anthropic.Anthropic(base_url=self.base, api_key="unused",
                                             max_retries=0, timeout=120)

    def get(self, path):
        return httpx.get(self.base + path, timeout=30)

    def pool(self):
        return self.get("/engine").json()["pool"]

    def resident(self):
        return {e["model"]: e for e in self.pool()["resident"]}

    def rows(self):
        return {r["id"]: r for r in self.get("/v1/models").json()["data"]}

    def wait(self, cond, what, timeout=120):
        self.server.wait_until(cond, what, timeout)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("pool")
    snaps = library_hub(root / "hf" / "hub", MODELS)
    home = root / "home"
    home.mkdir()
    (home / "mlxbun.yaml").write_text(CONFIG)  # found in $MLXBUN_HOME, no --config
    return root, snaps


@pytest.fixture(scope="module")
def parent(hub):
    with serve(env=library_env(hub[0]), ready=None) as server:
        p = Parent(server)
        p.wait(lambda: {LLAMA, QWEN} <= {m for m, e in p.resident().items()
                                         if e["state"] == "ready"}, "the default and the pin")
        yield p


def no_eos(hub, repo) -> dict:
    """logit_bias that bans the checkpoint's EOS ids (a random model may stop at once)."""
    eos = json.loads((hub[1][repo] / "config.json").read_text())["eos_token_id"]
    return {str(i): -100 for i in (eos if isinstance(eos, list) else [eos])}


def test_models_lists_what_may_be_asked_for_with_its_state(parent):
    rows = parent.rows()
    assert OUTSIDER not in rows  # on disk, but not on the allow-list
    assert rows[LLAMA]["state"] == "resident" and not rows[LLAMA]["pinned"]
    assert rows[QWEN]["state"] == "resident" and rows[QWEN]["pinned"]
    assert rows[CODER]["state"] == "on_disk"
    assert rows["ghost/Not-Here"]["state"] == "missing"  # allowed, not downloaded
    assert rows["coder"]["alias_of"] == CODER and rows["coder"]["state"] == "on_disk"
    assert rows["tiny"]["alias_of"] == QWEN and rows["tiny"]["state"] == "resident"
    assert parent.pool()["pins"] == [QWEN]


def test_alias_routes_a_chat_and_the_pin_survives_pressure(parent, hub):
    parent.openai.completions.create(model=LLAMA, prompt="hi", max_tokens=1)
    # the pin is now the least recently used engine: plain LRU would drain it next
    r = parent.openai.chat.completions.create(
        model="coder", messages=[{"role": "user", "content": "hi"}],
        logit_bias=no_eos(hub, CODER))
    assert r.model == CODER
    # coder's own max_tokens from the file: the request sent none
    assert r.usage.completion_tokens == 2 and r.choices[0].finish_reason == "length"
    resident = parent.resident()
    assert set(resident) == {CODER, QWEN}  # the default was drained, the older pin stayed
    assert resident[QWEN]["pinned"] and parent.pool()["evictions"] == 1


def test_per_model_template_kwargs_apply_unless_the_request_sends_its_own(parent, hub):
    def prompt_tokens(**extra):
        return parent.openai.chat.completions.create(
            model="coder", messages=[{"role": "user", "content": "hi"}], max_tokens=1,
            **extra).usage.prompt_tokens

    with_persona = prompt_tokens()
    own = prompt_tokens(extra_body={"chat_template_kwargs": {"persona": ""}})
    assert own < with_persona  # the request's value won over the file's persona


def test_allow_list_refuses_other_models_in_each_surface_shape(parent):
    for model in (OUTSIDER, "gpt-4"):
        with pytest.raises(openai.NotFoundError) as refused:
            parent.openai.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=1)
        assert refused.value.code == "model_not_found" and model in refused.value.message
    with pytest.raises(anthropic.NotFoundError) as refused_a:
        parent.anthropic.messages.create(model=OUTSIDER, max_tokens=1,
                                         messages=[{"role": "user", "content": "hi"}])
    assert refused_a.value.body["error"]["type"] == "not_found_error"
    assert OUTSIDER not in parent.resident()  # nothing was started for it
    with pytest.raises(openai.NotFoundError) as missing:
        parent.openai.completions.create(model="ghost/Not-Here", prompt="hi", max_tokens=1)
    assert "allowed but not on disk" in missing.value.message
    with pytest.raises(openai.BadRequestError) as bad:
        parent.openai.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=1,
            extra_body={"keep_alive": "soon"})
    assert bad.value.param == "keep_alive"


def test_idle_engine_unloads_after_its_keep_alive(parent, hub):
    before = parent.pool()["unloads"]
    parent.openai.chat.completions.create(
        model="coder", messages=[{"role": "user", "content": "hi"}], max_tokens=1,
        extra_body={"keep_alive": "3s"})
    row = parent.rows()[CODER]
    assert row["state"] == "resident" and row["expires_at"] <= time.time() + 3.5
    parent.wait(lambda: CODER not in parent.resident(), "the TTL unload", timeout=20)
    assert parent.pool()["unloads"] == before + 1
    assert parent.rows()[CODER]["state"] == "on_disk" and QWEN in parent.resident()


def test_keep_alive_zero_unloads_after_the_reply_but_never_a_pin(parent):
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            "extra_body": {"keep_alive": 0}}
    parent.openai.chat.completions.create(model="tiny", **chat)
    parent.openai.chat.completions.create(model=CODER, **chat)
    parent.wait(lambda: CODER not in parent.resident(), "the keep_alive 0 unload", timeout=20)
    time.sleep(1.0)  # several reaper rounds
    assert parent.resident()[QWEN]["state"] == "ready"
