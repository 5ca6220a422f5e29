"""mlxbun-glm52: the GLM-5.x family (``model_type: glm_moe_dsa``, GlmMoeDsaForCausalLM).

The forward pass is mlx-lm's ``glm_moe_dsa`` (MLA + DSA indexer + sigmoid-routed MoE);
this plugin adds what differs from the generic path:

* thinking defaults **off**: the generation primer is an empty ``<think></think>``;
  ``enable_thinking: true`` (or any ``reasoning_effort`` but ``"none"``) renders
  ``Reasoning Effort: Max`` in the system turn and leaves ``<think>`` open;
* a GLM-5 chat template (``template.jinja``) for checkpoints that ship none;
* the ``<tool_call>name<arg_key>…</arg_key><arg_value>…</arg_value></tool_call>`` parser;
* the checkpoint's MTP layer (``model.layers.{N}``) as a speculative drafter
  (:mod:`.mtp`; on by default where the checkpoint has one, ``--mtp off`` removes it);
* routed experts streamed from the checkpoint under a byte budget (``--expert-budget``,
  :mod:`.streaming`), for a model bigger than memory; ``/stats`` and ``/fit`` gain a
  ``glm52`` block (:mod:`.report`).
"""

from __future__ import annotations

from mlxbun_core.chat_template import apply_template, thinking_switch
from mlxbun_core.family import Family, load_mlx_lm, packaged_template
from mlxbun_core.hookspecs import hookimpl

from .toolcalls import GlmDialect, make_parser

__all__ = ["FAMILY", "GlmDialect", "claims", "load_model", "model_report", "render_chat",
           "token_predictor", "tool_call_parser"]

FAMILY = "glm52"
MODEL_TYPES = ("glm_moe_dsa",)
ARCHITECTURES = ("GlmMoeDsaForCausalLM",)
GLM52 = Family(FAMILY, MODEL_TYPES, ARCHITECTURES)
# Z.ai's published sampling for GLM-5.x; the checkpoint's generation_config.json wins
# (the loader merges it over these).
FAMILY_DEFAULTS = {"temperature": 1.0, "top_p": 0.95}


def fallback_template() -> str:
    return packaged_template(__name__)


@hookimpl
def claims(config):
    return GLM52.claim(config)


@hookimpl
def load_model(path, config, options):
    kw = dict(template=fallback_template(), reasoning=True,
              generation_defaults=dict(FAMILY_DEFAULTS))
    from mlxbun_core.experts.streaming import asked, load_streamed

    budget = asked(options)
    if budget is not None:  # routed experts stay on disk, read on demand
        return load_streamed(path, config, options, budget, **kw)
    return load_mlx_lm(path, config, options, **kw)


@hookimpl
def render_chat(model, messages, tools, template_kwargs, reasoning_effort):
    thinking = bool(thinking_switch(template_kwargs, reasoning_effort, False))  # no-think default
    return apply_template(model, messages, tools, dict(template_kwargs, enable_thinking=thinking))


@hookimpl
def model_report(model, section):
    from .report import fit_block, stats_block

    block = stats_block(model) if section == "stats" else fit_block(model)
    return {FAMILY: block}


@hookimpl
def tool_call_parser(model, tools):
    return make_parser(tools)


@hookimpl
def token_predictor(model):
    """The checkpoint's MTP layer, when it carries one (``mtp.py``)."""
    from .mtp import load_predictor

    return load_predictor(model)
