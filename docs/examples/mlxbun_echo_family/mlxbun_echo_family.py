"""A third-party family in one module: the smallest complete mlxbun plugin.

It claims any checkpoint whose config.json lists ``"EchoLlamaForCausalLM"`` in
``architectures`` (a llama with its own name), loads it with mlx-lm, and renders chat with a
plain "User:/Assistant:" template. Nothing in mlxbun's core knows it exists;
the entry point in pyproject.toml is the whole integration.
"""

from mlxbun_core import hookimpl
from mlxbun_core.model import LoadedModel, Prompt

FAMILY = "echo"


@hookimpl
def load_model(path, config, options):
    if "EchoLlamaForCausalLM" not in config.get("architectures", []):
        return None
    from mlx_lm.utils import load

    model, tokenizer = load(str(path))
    return LoadedModel(id=options.model_id, path=path, config=config, model=model,
                       tokenizer=tokenizer, family=FAMILY)


@hookimpl
def render_chat(model, messages):
    if model.family != FAMILY:
        return None
    text = "".join(f"{m['role'].title()}: {m.get('content') or ''}\n" for m in messages)
    text += "Assistant:"
    return Prompt(tokens=model.tokenizer.encode(text), text=text)
