"""Issue #37's serving rows that are flags, variables and small routes: mlx_lm.server's
spellings, ``--thinking`` seen by a real client, the reference's switches applied or
refused at start with the reason, ``/stats``' explicit budget, ``inspect-dataset`` on a
missing path, the reference's ``/assets/hljs.*`` names, the batch's switches."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import mlx.core as mx
import openai
import pytest

from mlxbun_core import cli, runconfig
from mlxbun_core.config import apply_config
from mlxbun_core.engine.batch import sampling as batch_sampling
from mlxbun_core.serve_switches import apply_switches, fold_aliases
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server

BUDGET = 3 * 10**9
# a template that takes the thinking switch, as hybrid-reasoning checkpoints' do
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% endif %}")
WEB = Path(cli.__file__).parent / "web" / "assets" / "vendor"


def parsed(*argv: str):
    """``serve`` parsed as ``mlxbun serve`` parses it (file and aliases folded)."""
    argv = ["serve", *argv]
    args = cli.build_parser().parse_args(argv)
    fold_aliases(args, apply_config(args, argv, cli.build_serve_parser).sources)
    return args


@pytest.mark.parametrize(("argv", "temperature", "batch"), [
    (("--temp", "0.3"), 0.3, None),
    (("--temperature", "0.5", "--temp", "0.3"), 0.5, None),
    (("--temp", "0.3", "--temperature", "0.5"), 0.5, None),
    (("--decode-concurrency", "3"), None, 3),
    (("--batch", "2", "--decode-concurrency", "3"), None, 2),
])
def test_mlx_lm_spellings_fold_into_ours_and_ours_win(tmp_path, monkeypatch, argv,
                                                      temperature, batch):
    monkeypatch.setenv("MLXBUN_HOME", str(tmp_path))
    monkeypatch.delenv("MLXBUN_BATCH", raising=False)
    args = parsed(*argv)
    assert (args.temperature, args.batch) == (temperature, batch)


def test_the_alias_wins_over_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXBUN_HOME", str(tmp_path))
    monkeypatch.setenv("MLXBUN_BATCH", "8")
    args = parsed("--decode-concurrency", "3")
    assert args.batch == 3 and args.settings.sources["batch"] == "flag --decode-concurrency"


def test_refused_switches_and_variables_stop_the_start_with_each_reason(tmp_path):
    env = {**os.environ, "MLXBUN_HOME": str(tmp_path), "MLXBUN_BATCH_EXTEND": "0",
           "MLXBUN_QWEN_SPEC_KV4": "1", "MLXBUN_MTP_PROMPT_CACHE": "1", "MLXBUN_FILL": "echo"}
    run = subprocess.run(
        [sys.executable, "-m", "mlxbun_core.cli", "serve", "--port", "0", "--fused-sdpa", "on",
         "--compiled-decode", "off", "--compiled-activations", "on", "--force-wire", "--l1",
         "--l2", "--l3"], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    said = run.stderr
    for name in ("--fused-sdpa", "--compiled-decode", "--compiled-activations on",
                 "--force-wire", "--l1", "--l2", "--l3", "MLXBUN_BATCH_EXTEND",
                 "MLXBUN_QWEN_SPEC_KV4", "MLXBUN_MTP_PROMPT_CACHE", "MLXBUN_FILL=echo"):
        assert f"mlxbun: {name}" in said and "is refused: " in said, name
    assert "on cpu MLX has nothing to wire" in said
    assert "Traceback" not in said


def test_grammar_jump_is_fill_and_fill_wins():
    assert runconfig.from_environ({"MLXBUN_GRAMMAR_JUMP": "1"}).engine.fill == "strict"
    assert runconfig.from_environ({"MLXBUN_GRAMMAR_JUMP": "1",
                                   "MLXBUN_FILL": "off"}).engine.fill == "off"
    with pytest.raises(ValueError, match="MLXBUN_GRAMMAR_JUMP must be off or strict"):
        runconfig.from_environ({"MLXBUN_GRAMMAR_JUMP": "maybe"})


def test_variables_that_map_onto_the_engine():
    cfg = runconfig.from_environ({"MLXBUN_SSD_SPILL_QUEUE_GB": "0.5", "MLXBUN_THINKING": "off",
                                  "MLXBUN_BATCH_VEC_SAMPLE": "0", "MLXBUN_BATCH_SSM": "0"})
    assert cfg.cache.ssd_spill_queue_bytes == 1 << 29
    assert (cfg.engine.thinking, cfg.engine.batch_vec_sample, cfg.engine.batch_ssm) == (
        False, False, False)
    for bad in ({"MLXBUN_SSD_SPILL_QUEUE_GB": "-1"}, {"MLXBUN_BATCH_SSM": "maybe"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            runconfig.from_environ(bad)


def test_compiled_activations_off_turns_mlx_compile_off():
    calls = []

    def body(x):
        calls.append(1)  # runs at every call only when the function is not compiled
        return x * 2

    try:
        compiled = mx.compile(body)
        for _ in range(5):
            mx.eval(compiled(mx.array([1.0])))
        assert len(calls) < 5  # traced, then replayed
        assert apply_switches(parsed("--compiled-activations", "off")) != []
        calls.clear()
        off = mx.compile(body)
        for _ in range(5):
            mx.eval(off(mx.array([1.0])))
        assert len(calls) == 5
    finally:
        mx.enable_compile()


@pytest.mark.parametrize("vectorized", [True, False])
def test_batch_vec_sample_switch(vectorized):
    seen = []

    def sampler(logprobs):
        seen.append(logprobs.shape[0])
        return mx.argmax(logprobs, axis=-1)

    logprobs = mx.log(mx.softmax(mx.random.normal((3, 11)), axis=-1))
    with runconfig.overridden(engine={"batch_vec_sample": vectorized}):
        got = batch_sampling.sample(logprobs, [sampler] * 3)
    assert got.tolist() == mx.argmax(logprobs, axis=-1).tolist()  # same tokens either way
    assert seen == ([3] if vectorized else [1, 1, 1])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with runconfig.overridden(engine={"thinking": False}):
        srv = start_server(tiny_checkpoint("qwen3", chat_template=THINKING_TEMPLATE),
                           memory_budget_bytes=BUDGET,
                           sessions_dir=tmp_path_factory.mktemp("sessions"))
        yield srv
        srv.stop()


def prompt_tokens(server, **extra) -> int:
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x")
    r = client.chat.completions.create(model="m", max_tokens=1, temperature=0,
                                       messages=[{"role": "user", "content": "hi"}],
                                       extra_body=extra or None)
    return r.usage.prompt_tokens


def test_thinking_is_the_servers_default_and_a_request_still_decides(server):
    off = prompt_tokens(server, chat_template_kwargs={"enable_thinking": False})
    on = prompt_tokens(server, chat_template_kwargs={"enable_thinking": True})
    assert off != on  # the template takes the switch
    assert prompt_tokens(server) == off  # --thinking false
    assert prompt_tokens(server, reasoning_effort="high") == on


def test_stats_reports_the_explicit_memory_budget(server):
    admission = httpx.get(server.base_url + "/stats").json()["admission"]
    assert admission["memory_budget_bytes"] == BUDGET


def test_inspect_dataset_on_a_missing_path_is_200_ok_false(server, tmp_path):
    r = httpx.post(server.base_url + "/api/finetune/inspect-dataset",
                   json={"path": str(tmp_path / "nowhere")})
    assert r.status_code == 200
    body = r.json()
    assert body["ok"] is False and "does not exist" in body["error"]
    assert httpx.post(server.base_url + "/api/finetune/inspect-dataset",
                      json={}).status_code == 400  # no path at all is still a 400


def test_the_references_hljs_names_serve_the_vendored_files(server):
    for name, file in (("hljs.js", "highlight.min.js"), ("hljs.css", "hljs.css")):
        r = httpx.get(f"{server.base_url}/assets/{name}")
        assert r.status_code == 200 and r.content == (WEB / file).read_bytes(), name


def test_admin_lease_is_not_a_route_here(server):
    """Refused (docs/spec-rows.md): nothing here runs a job that needs the engine held."""
    r = httpx.post(server.base_url + "/admin/lease")
    assert r.status_code == 404
