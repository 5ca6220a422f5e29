"""``mlxbun generate`` / ``gen`` through a real subprocess on a tiny checkpoint: greedy text
equals mlx-lm's ``generate`` on the same checkpoint (raw and chat-templated), ``--json``
carries usage, ``-`` reads stdin, and bad invocations exit 2 with a reason."""

import json
import os
import subprocess
import sys

import pytest
from mlx_lm import generate as mlx_generate
from mlx_lm import load as mlx_load

from mlxbun_core.testing.checkpoints import tiny_checkpoint

CLI = [sys.executable, "-m", "mlxbun_core.cli"]


def mlxbun(*args, stdin=None):
    return subprocess.run([*CLI, *args], input=stdin or "", capture_output=True, text=True,
                          timeout=300, env={**os.environ, "MLXBUN_LOG_LEVEL": "warning"})


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("llama", seed=3)


@pytest.fixture(scope="module")
def oracle(ckpt):
    model, tok = mlx_load(str(ckpt))

    def run(prompt, n):
        return mlx_generate(model, tok, prompt=prompt, max_tokens=n)

    run.tokenizer = tok
    return run


def test_raw_greedy_equals_mlx_lm(ckpt, oracle):
    r = mlxbun("gen", str(ckpt), "--raw", "hello there", "--max-tokens", "12", "--temp", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout == oracle("hello there", 12) + "\n"


def test_chat_template_and_json_usage(ckpt, oracle):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    rendered = oracle.tokenizer.apply_chat_template(msgs, add_generation_prompt=True,
                                                   tokenize=False)
    r = mlxbun("generate", "--model", str(ckpt), "--prompt", "hi", "--system", "be brief",
               "--max-tokens", "9", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["text"] == oracle(rendered, 9)
    prompt_tokens = len(oracle.tokenizer.encode(rendered, add_special_tokens=False))
    assert out["usage"]["prompt_tokens"] == prompt_tokens
    assert out["usage"]["completion_tokens"] == 9 and out["finish_reason"] == "length"


def test_dash_reads_stdin(ckpt, oracle):
    r = mlxbun("gen", str(ckpt), "--raw", "-", "--max-tokens", "6", stdin="def fib(n):")
    assert r.returncode == 0, r.stderr
    assert r.stdout == oracle("def fib(n):", 6) + "\n"


@pytest.mark.parametrize("args,needle", [
    (["--raw", "--prompt", ""], "no prompt"),
    (["--raw", "--system", "x", "hi"], "--system needs the chat template"),
    (["a", "b"], "at most two positionals"),
])
def test_bad_invocations_exit_2(ckpt, args, needle):
    r = mlxbun("gen", str(ckpt), *args)
    assert r.returncode == 2 and needle in r.stderr, r.stderr
