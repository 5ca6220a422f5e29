"""The one table of request fields (``mlxbun_core/request_fields.py``) against everything
that lists them: the sampling dataclass, each surface's parser, the web chat's frames, the
``serve`` flags, ``mlxbun.yaml``'s per-model keys and what the loader reads from a
checkpoint. A field one of them takes that the table does not say (or the reverse) fails
here."""

from dataclasses import fields

import pytest

from mlxbun_core import cli, loader
from mlxbun_core.config import ConfigError, apply_config
from mlxbun_core.config.schema import serve_options
from mlxbun_core.config.yamlfile import MODEL_KEYS
from mlxbun_core.engine.completion_request import parse_completion
from mlxbun_core.engine.request import parse_chat
from mlxbun_core.engine.sampling import SamplingParams
from mlxbun_core.errors import BadRequest
from mlxbun_core.request_fields import BY_NAME, FIELDS, SURFACES, RequestField, accepted
from mlxbun_core.server.anthropic import request as anthropic_request
from mlxbun_core.server.openai import responses_request
from mlxbun_core.webchat import frames

USER = [{"role": "user", "content": "hi"}]
PARSERS = {
    "chat": lambda extra: parse_chat({"messages": USER, **extra}).sampling,
    "completions": lambda extra: parse_completion({"prompt": "hi", **extra}).sampling,
    "responses": lambda extra: responses_request.parse_request({"input": "hi", **extra}).sampling,
    "anthropic": lambda extra: anthropic_request.parse_request(
        {"max_tokens": 8, "messages": USER, **extra}).sampling,
}
SAMPLER_NAMES = {f.name for f in fields(SamplingParams)} - {"extra_processors"}


def good_value(f: RequestField) -> object:
    """A value in ``f``'s range that is not its default."""
    if f.kind == "number":
        assert f.lo is not None and f.hi is not None
        return f.lo + (min(f.hi, f.lo + 1) - f.lo) / 4
    return {"integer": 3, "boolean": True, "token_bias": {"1": 2.5}, "curve": {}}[f.kind]


def test_the_sampling_dataclass_is_the_table():
    assert set(BY_NAME) == SAMPLER_NAMES
    plain = SamplingParams()
    assert {f.name: getattr(plain, f.name) for f in FIELDS} == {f.name: f.default for f in FIELDS}


@pytest.mark.parametrize("surface", PARSERS)
def test_each_surface_reads_its_rows_and_no_others(surface):
    """Every row the surface reads comes through (under its spelling); every other one is
    left at the default, whatever the body says."""
    body = {f.spelling(surface) or f.name: good_value(f) for f in FIELDS}
    sampling = PARSERS[surface]({k: v for k, v in body.items()
                                 if not (surface == "anthropic" and k == "logit_bias")})
    for f in FIELDS:
        got = getattr(sampling, f.name)
        if f in accepted(surface):
            want = {1: 2.5} if f.kind == "token_bias" else good_value(f)
            assert got is not None and (f.kind == "curve" or got == want), f.name
        else:
            assert got == f.default, f"{surface} read {f.name}, which the table does not give it"


@pytest.mark.parametrize("surface", PARSERS)
@pytest.mark.parametrize("name", [f.name for f in FIELDS])
def test_a_wrong_type_is_a_400_naming_the_field_where_the_surface_reads_it(surface, name):
    f = BY_NAME[name]
    spelled = f.spelling(surface)
    if spelled is None:
        if surface == "anthropic" and name == "logit_bias":
            return  # refused outright: not a parameter of the Messages API
        PARSERS[surface]({name: "hot"})  # not read: no error
        return
    with pytest.raises(BadRequest) as caught:
        PARSERS[surface]({spelled: "hot"})
    assert caught.value.message.startswith(f"{spelled} must be")


@pytest.mark.parametrize("f", [f for f in FIELDS if f.checked and f.hi is not None],
                         ids=lambda f: f.name)
def test_the_ranges_are_the_tables(f):
    over = f.hi + (1 if f.kind == "integer" else 0.5)
    with pytest.raises(BadRequest, match=f"{f.name} must be at most"):
        SamplingParams.from_body({f.name: over})
    if f.kind != "boolean":
        with pytest.raises(BadRequest, match=f"{f.name} must be"):
            SamplingParams.from_body({f.name: True})  # a boolean is never a number


def test_the_web_chat_frame_takes_the_tables_rows():
    from mlxbun_core.webchat.settings_frames import SAMPLING_KEYS

    taken = set(frames.FIELDS["set_sampling"]) - {"scope", "max_tokens"}
    assert taken == {f.name for f in accepted("webchat")} == set(SAMPLING_KEYS) - {"max_tokens"}


def test_every_surface_is_in_the_table():
    assert set(PARSERS) | {"webchat"} == set(SURFACES)


def test_the_serve_flags_are_the_tables_and_match_the_yaml():
    """A sampler default the file sets per model is also a flag (and a ``serve:`` key)."""
    options = serve_options(cli.build_parser())
    flags = {name for name in options if name in SAMPLER_NAMES}
    assert flags == {f.name for f in FIELDS if f.flag}
    assert flags == set(MODEL_KEYS) & SAMPLER_NAMES == {f.name for f in FIELDS if f.per_model}
    assert all(options[f.name].flag == f.flag_name for f in FIELDS if f.flag)


def test_a_flag_is_checked_as_a_request_value_is(capsys):
    parser = cli.build_parser()
    args = parser.parse_args(["serve", "--presence-penalty", "-1.5", "--top-k", "40"])
    assert (args.presence_penalty, args.top_k) == (-1.5, 40)
    for bad in (["--top-p", "1.5"], ["--seed", "-1"], ["--top-k", "2.5"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", *bad])
    assert "--seed: must be at least 0" in capsys.readouterr().err.replace("argument ", "")


def test_a_serve_section_value_is_checked_too(tmp_path, monkeypatch):
    import os

    for var in [v for v in os.environ if v.startswith("MLXBUN_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("MLXBUN_HOME", str(tmp_path))
    (tmp_path / "mlxbun.yaml").write_text("serve:\n  frequency-context-size: 64\n")
    args = cli.build_parser().parse_args(["serve"])
    apply_config(args, ["serve"], cli.build_serve_parser)
    assert args.frequency_context_size == 64
    (tmp_path / "mlxbun.yaml").write_text("serve:\n  xtc_threshold: 0.9\n")
    with pytest.raises(ConfigError, match="xtc_threshold must be at most 0.5"):
        apply_config(args, ["serve"], cli.build_serve_parser)


def test_the_loader_reads_the_tables_checkpoint_keys():
    assert set(loader.GEN_DEFAULT_KEYS) == {f.name for f in FIELDS if f.checkpoint}
    assert set(loader.GEN_DEFAULT_KEYS) <= {f.name for f in FIELDS if f.per_model}
