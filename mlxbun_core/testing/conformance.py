"""The checks every family plugin must pass, written once: a family's own tests (ours, or a
third party's) subclass one of these classes and pytest runs the checks against the
module's ``srv`` (:mod:`.fixtures`: a server of the family's tiny checkpoint).

- :class:`FamilyChecks`, for every family: the served model's row names the family, the
  checkpoint is claimed for it, the built-in generic plugin takes it while the plugin is
  out, and ``mlxbun plugins`` lists the plugin (its distribution, the hooks it implements)
  and leaves it out under ``MLXBUN_DISABLE_PLUGINS``.
- :class:`ChatFamilyChecks`, for a family that chats: the prompt is the checkpoint's own
  template rendered by its tokenizer, the family's template is installed on a copy of
  the checkpoint that ships none, a chat streams what it answers whole, and greedy tokens
  equal mlx-lm's on the same prompt.
- :class:`ReasoningFamilyChecks`, for a family with a thinking switch: ``enable_thinking``
  and ``reasoning_effort`` turn it, the explicit switch wins, the think markers are named,
  and a bad ``reasoning_effort`` is a 400; served chat and parity run in both modes.

Set ``plugin`` (the registered name) and, where they differ from the defaults,
``family``, ``model_id`` (the id the checkpoint is claimed under) and ``fallback_template``
(the template installed when a checkpoint ships none)::

    class TestConformance(ReasoningFamilyChecks):
        plugin = "myfamily"
        fallback_template = mlxbun_myfamily.fallback_template()
"""

from __future__ import annotations

import json
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

import httpx
import openai
import pytest

from .. import loader, plugins
from ..model import LoadOptions
from .engine import rendered_chat
from .helpers import chat_both_ways, mlx_lm_greedy, plugins_listing, unregistered

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
EFFORTS = ("minimal", "low", "medium", "high", "xhigh")  # every accepted one but "none"
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def served_row(srv: Any) -> dict[str, Any]:
    return httpx.get(srv.v1 + "/models", timeout=30).json()["data"][0]


def distribution_of(plugin: str) -> tuple[str, str] | None:
    """``(name, version)`` of the installed distribution whose ``mlxbun`` entry point is
    ``plugin`` (None: registered in-process only)."""
    for dist in metadata.distributions():
        if any(ep.group == "mlxbun" and ep.name == plugin for ep in dist.entry_points):
            return dist.metadata["Name"], dist.version
    return None


def without_template(src: Path, dest: Path) -> Path:
    """A copy of the checkpoint ``src`` that ships no chat template."""
    shutil.copytree(src, dest)
    for name in TEMPLATE_FILES:
        (dest / name).unlink(missing_ok=True)
    config = dest / "tokenizer_config.json"
    data = json.loads(config.read_text())
    data.pop("chat_template", None)
    config.write_text(json.dumps(data))
    return dest


class FamilyChecks:
    """Checks for every family plugin (see the module docstring)."""

    plugin: ClassVar[str]
    family: ClassVar[str | None] = None  # the family's name, when not the plugin's
    model_id: ClassVar[str] = "m"
    embeddings: ClassVar[bool] = False

    @property
    def family_name(self) -> str:
        return self.family or self.plugin

    def test_the_served_model_names_the_family(self, srv: Any) -> None:
        row = served_row(srv)
        assert (row["family"], row["plugin"]) == (self.family_name, self.plugin)
        assert row["embeddings"] is self.embeddings

    def test_the_checkpoint_is_claimed_for_the_family(self, srv: Any) -> None:
        path, options = srv.engine.model.path, LoadOptions(model_id=self.model_id)
        claim = loader.identify(path, options)
        assert claim is not None and (claim.family, claim.plugin) == (self.family_name,
                                                                      self.plugin)
        with unregistered(self.plugin):
            claim = loader.identify(path, options)
            assert claim is not None and (claim.family, claim.plugin) == ("generic", "generic")
        again = loader.identify(path, options)
        assert again is not None and again.plugin == self.plugin

    def test_mlxbun_plugins_lists_it_and_honours_disable(self) -> None:
        manager = plugins.load_plugins()
        implemented = sorted(c.name for c in manager.get_hookcallers(
            manager.get_plugin(self.plugin)) or ())
        lines = plugins_listing().splitlines()
        head = [i for i, line in enumerate(lines) if line.startswith(f"{self.plugin} (")]
        assert len(head) == 1, f"{self.plugin} is not listed once:\n" + "\n".join(lines)
        line, hooks = lines[head[0]], lines[head[0] + 1]
        dist = distribution_of(self.plugin)
        assert dist is not None, f"no installed distribution has the entry point {self.plugin}"
        assert f"({dist[0]} {dist[1]})" in line and line.endswith(f"family {self.family_name}")
        assert hooks.strip() == "hooks: " + ", ".join(implemented)
        off = plugins_listing(MLXBUN_DISABLE_PLUGINS=self.plugin).splitlines()
        assert not [x for x in off if x.startswith(f"{self.plugin} (")]
        assert [x for x in off if x.startswith("generic (")]


class ChatFamilyChecks(FamilyChecks):
    """Checks for a family that chats (see the module docstring)."""

    fallback_template: ClassVar[str | None] = None
    reasoning: ClassVar[bool] = False
    # the chat_template_kwargs served chat and parity run under
    modes: ClassVar[tuple[dict[str, Any], ...]] = ({},)
    answer_tokens: ClassVar[int] = 8

    def render(self, srv: Any, **body: Any) -> tuple[str, Any]:
        return rendered_chat(srv.engine, {"messages": MESSAGES, **body})

    def test_the_served_model_says_whether_it_reasons(self, srv: Any) -> None:
        row = served_row(srv)
        assert row["reasoning"] is self.reasoning and row["capabilities"]["chat_completions"]

    def test_the_prompt_is_the_checkpoint_template_rendered(self, srv: Any) -> None:
        tok = srv.engine.model.tokenizer
        for kwargs in self.modes:
            text = tok.apply_chat_template(MESSAGES, add_generation_prompt=True,
                                           tokenize=False, **kwargs)
            ours = self.render(srv, chat_template_kwargs=kwargs)[1].prompt_tokens
            assert ours == tok.encode(text, add_special_tokens=False), kwargs

    def test_its_template_is_installed_where_a_checkpoint_ships_none(
            self, srv: Any, tmp_path: Path) -> None:
        assert self.fallback_template, "set fallback_template: the template the family installs"
        bare = without_template(srv.engine.model.path, tmp_path / "bare")
        m = loader.claim(bare, LoadOptions(model_id=self.model_id))
        assert (m.family, m.extras.get("fallback_template")) == (self.family_name, True)
        assert m.tokenizer.chat_template == self.fallback_template
        prompt = m.hooks.render_chat(model=m, messages=MESSAGES, tools=None,
                                     template_kwargs={}, reasoning_effort=None)
        assert prompt.tokens and "France" in prompt.text

    def test_a_chat_streams_what_it_answers_whole(self, client: Any, srv: Any) -> None:
        for kwargs in self.modes:
            full, _ = chat_both_ways(client, model="m", messages=MESSAGES, max_tokens=6,
                                     temperature=0,
                                     extra_body={"chat_template_kwargs": kwargs})
            assert full.model == srv.engine.model.id

    def test_greedy_tokens_equal_mlx_lm(self, client: Any, srv: Any) -> None:
        from mlx_lm import load as mlx_load

        model = mlx_load(str(srv.engine.model.path))[0]
        tok = srv.engine.model.tokenizer  # the family's template where the checkpoint has none
        for kwargs in self.modes:
            r = client.chat.completions.create(
                model="m", messages=MESSAGES, max_tokens=self.answer_tokens, temperature=0,
                extra_body={"logprobs": True, "chat_template_kwargs": kwargs})
            ours = [e.model_extra["id"] for e in r.choices[0].logprobs.content]
            text = tok.apply_chat_template(MESSAGES, add_generation_prompt=True,
                                           tokenize=False, **kwargs)
            prompt = tok.encode(text, add_special_tokens=False)
            assert r.usage.prompt_tokens == len(prompt), kwargs
            want = mlx_lm_greedy(model, prompt, self.answer_tokens, srv.engine.model.eos_token_ids)
            assert ours == want and ours, kwargs


class ReasoningFamilyChecks(ChatFamilyChecks):
    """Checks for a family with a thinking switch (see the module docstring)."""

    reasoning = True
    modes = ({"enable_thinking": False}, {"enable_thinking": True})

    def test_the_thinking_switch_and_which_setting_wins(self, srv: Any) -> None:
        off = self.render(srv, chat_template_kwargs={"enable_thinking": False})
        on = self.render(srv, chat_template_kwargs={"enable_thinking": True})
        assert off[0] != on[0]
        assert off[1].think_start and off[1].think_end  # the markers the session splits on
        assert self.render(srv, reasoning_effort="none")[0] == off[0]
        for effort in EFFORTS:
            assert self.render(srv, reasoning_effort=effort)[0] != off[0], effort
        assert self.render(srv, reasoning_effort="high",  # the explicit switch wins
                           chat_template_kwargs={"enable_thinking": False})[0] == off[0]
        assert self.render(srv, reasoning_effort="none",
                           chat_template_kwargs={"enable_thinking": True})[0] == on[0]

    @pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": True}])
    def test_a_bad_reasoning_effort_is_a_400(self, client: Any, kwargs: dict) -> None:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(
                model="m", messages=MESSAGES, max_tokens=1,
                extra_body={"reasoning_effort": "extreme", "chat_template_kwargs": kwargs})
        assert "reasoning_effort must be one of" in str(e.value)
