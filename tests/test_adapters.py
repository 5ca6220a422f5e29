"""LoRA adapters over real HTTP: greedy parity with mlx-lm's own adapter loading on
every generation surface, stacking, interleaving, mount / list / delete, refusals,
and the base path left exactly as it was."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import anthropic
import httpx
import mlx.core as mx
import openai
import pytest

from mlxbun_core.testing.adapters import write_lora_adapter, write_peft_copy
from mlxbun_core.testing.checkpoints import tiny_checkpoint, write_checkpoint
from mlxbun_core.testing.server import start_server

N = 10
MESSAGES = [{"role": "user", "content": "Tell me a story about the sea"}]
PROMPT = "Once upon a time in a land far away"


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("llama")


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("adapters-home")


@pytest.fixture(scope="module")
def made(ckpt, home):
    """Adapters a and b (mlx-lm layers, non-zero), a's PEFT twin, all under <home>/adapters."""
    root = home / "adapters"
    a = write_lora_adapter(ckpt, root / "a", seed=1)
    b = write_lora_adapter(ckpt, root / "b", seed=2, keys=["self_attn.q_proj", "mlp.down_proj"])
    pa = write_peft_copy(a, root / "a-peft")
    return {"a": a, "b": b, "pa": pa}


@pytest.fixture(scope="module")
def server(ckpt, made, home):
    old = os.environ.get("MLXBUN_HOME")
    os.environ["MLXBUN_HOME"] = str(home)
    srv = start_server(ckpt)
    yield srv
    srv.stop()
    if old is None:
        os.environ.pop("MLXBUN_HOME", None)
    else:
        os.environ["MLXBUN_HOME"] = old


def mount(server, id, path, **extra):
    return httpx.post(server.v1 + "/adapters", json={"id": id, "path": str(path), **extra},
                      timeout=60)


@pytest.fixture(scope="module")
def mounted(server, made):
    for id, path in (("a", made["a"]), ("b", made["b"]), ("pa", made["pa"])):
        r = mount(server, id, path)
        assert r.status_code == 200, r.text
    return server


def reference(ckpt, adapter, tokens):
    """mlx-lm's own greedy decode with ``adapter_path`` (None: the base model)."""
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load

    model, tok = load(str(ckpt), adapter_path=str(adapter) if adapter else None)
    out = []
    for (t, _), _ in zip(generate_step(mx.array(tokens), model, max_tokens=N), range(N)):
        out.append(t)
        if t in tok.eos_token_ids:
            break
    return out


def token_ids(server, route: str, adapter, **body):
    """Greedy token ids of a chat or completions request, from its logprobs."""
    body = {"model": "m", "max_tokens": N, "temperature": 0, "logprobs": True, **body}
    if adapter is not None:
        body["adapter"] = adapter
    r = httpx.post(server.v1 + route, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return [e["id"] for e in r.json()["choices"][0]["logprobs"]["content"]]


def completion(client, adapter):
    extra = {} if adapter is None else {"adapter": adapter}
    return client.completions.create(model="m", prompt=PROMPT, max_tokens=N, temperature=0,
                                     extra_body=extra)


def prompt_tokens(ckpt, chat: bool):
    from mlx_lm.utils import load_tokenizer

    tok = load_tokenizer(Path(ckpt))
    if chat:
        return tok.apply_chat_template(MESSAGES, add_generation_prompt=True)
    return tok.encode(PROMPT)


def test_greedy_output_equals_mlx_lm_with_the_adapter_on_every_surface(mounted, ckpt, made):
    client = openai.OpenAI(base_url=mounted.v1, api_key="x", max_retries=0)
    chat_prompt, text_prompt = prompt_tokens(ckpt, chat=True), prompt_tokens(ckpt, chat=False)
    want_chat = reference(ckpt, made["a"], chat_prompt)
    want_text = reference(ckpt, made["a"], text_prompt)
    assert want_chat != reference(ckpt, None, chat_prompt)  # the adapter changes the answer
    assert token_ids(mounted, "/chat/completions", "a", messages=MESSAGES) == want_chat
    assert token_ids(mounted, "/completions", "a", prompt=PROMPT) == want_text
    assert token_ids(mounted, "/completions", "pa", prompt=PROMPT) == want_text  # PEFT twin
    assert token_ids(mounted, "/completions", None, prompt=PROMPT) == reference(
        ckpt, None, text_prompt)
    assert token_ids(mounted, "/chat/completions", "none", messages=MESSAGES) == reference(
        ckpt, None, chat_prompt)

    # the Anthropic and Responses surfaces pass the field through to the same generation
    chat = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=N,
                                          temperature=0, extra_body={"adapter": "a"})
    want_chat = chat.choices[0].message.content
    base_chat = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=N,
                                               temperature=0).choices[0].message.content
    assert want_chat != base_chat
    an = anthropic.Anthropic(base_url=mounted.base_url, api_key="x", max_retries=0)
    msg = an.messages.create(model="m", max_tokens=N, messages=MESSAGES,
                             extra_body={"adapter": "a", "temperature": 0})
    assert "".join(b.text for b in msg.content if b.type == "text") == want_chat
    resp = client.responses.create(model="m", input=MESSAGES[0]["content"], max_output_tokens=N,
                                   temperature=0, extra_body={"adapter": "a"})
    assert resp.output_text == want_chat


def test_stacked_adapters_differ_from_each_part(mounted):
    client = openai.OpenAI(base_url=mounted.v1, api_key="x", max_retries=0)
    texts = {spec: completion(client, spec).choices[0].text for spec in ("a", "b", "a+b", "a,b")}
    assert texts["a+b"] == texts["a,b"]
    assert texts["a+b"] != texts["a"] and texts["a+b"] != texts["b"]


def test_interleaved_adapter_and_base_requests_each_get_their_own_answer(mounted):
    specs = ["a", "none", "a", "b", None, "a+b", "pa", "none"]
    client = openai.OpenAI(base_url=mounted.v1, api_key="x", max_retries=0)
    alone = {s: completion(client, s).choices[0].text for s in set(specs)}

    async def together():
        ac = openai.AsyncOpenAI(base_url=mounted.v1, api_key="x", max_retries=0)
        return await asyncio.gather(*[ac.completions.create(
            model="m", prompt=PROMPT, max_tokens=N, temperature=0,
            extra_body={} if s is None else {"adapter": s}) for s in specs])

    got = asyncio.run(together())
    assert [r.choices[0].text for r in got] == [alone[s] for s in specs]
    assert {r.usage.model_extra["lane"] for r in got} == {"batched"}


def test_adapters_never_share_prefix_kv(mounted):
    client = openai.OpenAI(base_url=mounted.v1, api_key="x", max_retries=0)
    long = "The quick brown fox jumps over the lazy dog. " * 6

    def cached(spec):
        r = client.completions.create(model="m", prompt=long, max_tokens=2, temperature=0,
                                      extra_body={"adapter": spec})
        return r.usage.prompt_tokens_details.cached_tokens

    cached("a")
    assert cached("a") > 20  # the same adapter reuses its own KV
    # another set never sees it: at most the BOS token its own earlier requests cached
    assert cached("b") <= 1 and cached("a+b") <= 1 and cached("none") <= 1


def test_mount_list_delete_and_refusals(mounted, made, ckpt, tmp_path):
    rows = httpx.get(mounted.v1 + "/adapters").json()["adapters"]
    by_id = {r["id"]: r for r in rows}
    assert set(by_id) >= {"a", "b", "pa"}
    on_disk = sum(v.nbytes for v in mx.load(str(made["a"] / "adapters.safetensors")).values())
    assert by_id["a"]["ram_bytes"] == on_disk and by_id["a"]["mounted_layers"] == 14
    assert by_id["b"]["mounted_layers"] == 4 and by_id["a"]["rank"] == 4

    avail = {r["id"]: r for r in httpx.get(mounted.v1 + "/adapters/available").json()["adapters"]}
    assert avail["a"]["mounted"] and avail["a"]["compatible"] and avail["a-peft"]["mounted"]

    client = openai.OpenAI(base_url=mounted.v1, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="'nope' is not mounted"):
        completion(client, "a+nope")
    an = anthropic.Anthropic(base_url=mounted.base_url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="nope"):
        an.messages.create(model="m", max_tokens=2, messages=MESSAGES,
                           extra_body={"adapter": "nope"})

    # a different model's adapter: refused by its recorded base, and by shape when forced
    other = write_checkpoint(tmp_path / "wide", "llama", config_overrides={"hidden_size": 96})
    wrong = write_lora_adapter(other, tmp_path / "wrong")
    r = mount(mounted, "wrong", wrong)
    assert r.status_code == 400 and "trained on" in r.json()["error"]["message"]
    r = mount(mounted, "wrong", wrong, force=True)
    assert r.status_code == 400 and "do not fit" in r.json()["error"]["message"]
    assert "wrong" not in {x["id"] for x in httpx.get(mounted.v1 + "/adapters").json()["adapters"]}
    # a failed re-mount of an existing id leaves the old one mounted
    assert mount(mounted, "b", wrong, force=True).status_code == 400
    assert completion(client, "b").choices[0].text

    for bad in ("", "../a", "a+b", "none"):
        assert mount(mounted, bad, made["a"]).status_code == 400
    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(loop)
    r = mount(mounted, "x", loop)
    assert r.status_code == 400 and "symlink loop" in r.json()["error"]["message"]
    assert mount(mounted, "x", str(made["a"]) + "/../../../etc").status_code == 400
    assert mount(mounted, "x", "/no/such/dir").status_code == 400
    assert httpx.post(mounted.v1 + "/adapters", json={"id": "x"}).json()["error"]["message"] == \
        "id and path required"

    r = httpx.delete(mounted.v1 + "/adapters/pa")
    assert r.status_code == 200 and r.json() == {"id": "pa", "removed_layers": 14}
    assert httpx.delete(mounted.v1 + "/adapters/pa").status_code == 404
    with pytest.raises(openai.BadRequestError):
        completion(client, "pa")
    assert mount(mounted, "pa", made["pa"]).status_code == 200


def test_no_adapter_mounted_leaves_the_model_untouched(ckpt):
    """With nothing mounted the served model holds only its own layers and greedy
    tokens equal mlx-lm's."""
    import mlx.nn as nn

    srv = start_server(ckpt)
    try:
        layers = {type(m).__name__ for _, m in srv.engine.model.model.named_modules()}
        assert "LoRAStackLinear" not in layers and "Linear" in layers
        client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
        assert token_ids(srv, "/chat/completions", None, messages=MESSAGES) == reference(
            ckpt, None, prompt_tokens(ckpt, chat=True))
        assert completion(client, None).usage.completion_tokens > 0
        assert isinstance(srv.engine.model.model.model.layers[0].self_attn.q_proj, nn.Linear)
    finally:
        srv.stop()


def test_serve_adapter_flag(ckpt, made, tmp_path):
    """A bad --adapter fails start-up with a clear message; a good one is the default."""
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text("{}")
    env = {**os.environ, "MLXBUN_HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "mlxbun_core.cli", "serve", str(ckpt),
                          "--adapter", str(bad), "--port", "1"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert run.returncode == 2
    assert "adapter" in run.stderr and "adapters.safetensors" in run.stderr

    from mlxbun_core.engine.core import Engine
    from mlxbun_core.startup import mount_startup_adapter

    engine = Engine.load(str(ckpt), progress=False)
    try:
        assert mount_startup_adapter(engine, str(made["a"]))
        assert engine.adapters.default == "a"
        assert engine.adapters.resolve(None).spec == "a"
        assert engine.adapters.resolve("none").spec == "none"
    finally:
        engine.worker.close()


@pytest.mark.parametrize("model_type", ["qwen3", "glm_moe_dsa"])
def test_parity_on_other_families(model_type, tmp_path):
    """Expert (switch) layers carry LoRA too: glm_moe_dsa's adapter covers its MoE MLPs."""
    from mlxbun_core.engine.core import Engine
    from mlxbun_core.engine.reply import gather

    ckpt = tiny_checkpoint(model_type)
    adapter = write_lora_adapter(ckpt, tmp_path / "a")
    tokens_of = prompt_tokens(ckpt, chat=False)
    engine = Engine.load(str(ckpt), progress=False)
    try:
        engine.worker.run_sync(lambda: engine.adapters.mount("a", adapter))

        async def run(spec):
            gen = await engine.start(engine.parse_completion(
                {"prompt": PROMPT, "max_tokens": N, "temperature": 0, "logprobs": True,
                 "adapter": spec}))
            return [e["id"] for e in gather([ev async for ev in gen.events()]).finish.logprobs]

        assert asyncio.run(run("a")) == reference(ckpt, adapter, tokens_of)
        assert asyncio.run(run("none")) == reference(ckpt, None, tokens_of)
    finally:
        engine.worker.close()
