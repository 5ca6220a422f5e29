"""Real coding-agent CLIs against a real server: Claude Code (npm ``@anthropic-ai/claude-code``)
on /v1/messages and OpenAI's Codex CLI (npm ``@openai/codex``) on /v1/responses.

The clients are the published binaries, installed from npm by the ``npm_clients`` fixture
(a missing npm fails these tests), run non-interactively (``claude -p``, ``codex exec``)
with a throwaway home. Each runs its whole agent loop: the model calls a tool, the client
runs it, sends the result back, and the model answers from it. Their real requests go
through the real engine: Claude Code's ~30k-token prompt (system blocks with its billing
header, a system-role message after the user turn, adaptive thinking, effort, context
management, metadata, ``?beta=true``), Codex's ~16k-token one (developer messages,
namespace and web_search tools, ``include``, ``prompt_cache_key``). The model is a tiny
one-sliding-layer checkpoint (linear prefill) whose logits follow a script chosen from
the prompt it was shown (tests/scripted_model.py), so what the client prints is exact.
"""

from __future__ import annotations

import json
import logging
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from mlxbun_core.testing.clients import long_context_options, run_claude, run_codex
from mlxbun_core.testing.process import serve
from scripted_model import scripted_server

QUESTION = "What does hello.txt say?"


@pytest.fixture(scope="module")
def server():
    with scripted_server("", name="scripted-clients", seed=4545,
                         **long_context_options()) as (srv, plugin):
        yield srv, plugin


@pytest.fixture
def work(tmp_path):
    """A working directory holding hello.txt with a fresh token; (dir, token)."""
    token = f"mlxbun-{uuid.uuid4().hex[:12]}"
    cwd = tmp_path / "work"
    cwd.mkdir()
    (cwd / "hello.txt").write_text(token + "\n", encoding="utf-8")
    return cwd, token


def scripted_agent(token: str, call: str):
    """The model's script: ``call`` first; once the tool's output (the token) is in the
    prompt, an answer quoting it; a second turn without it says so (and the test fails)."""
    def reply(prompt: str) -> str:
        if token in prompt:
            return f"The file says {token}."
        if prompt.count("<|im_start|>assistant") > 1:  # an earlier turn + the generation prompt
            return "The tool result did not reach me."
        return "<tool_call>" + call + "</tool_call>"
    return reply


def test_claude_code_reads_a_file(server, npm_clients, work, tmp_path):
    srv, plugin = server
    cwd, token = work
    call = json.dumps({"name": "Read", "arguments": {"file_path": str(cwd / "hello.txt")}})
    plugin.reply = scripted_agent(token, call)
    seen = len(plugin.prompts)
    done = run_claude(npm_clients["claude"], srv.base_url, QUESTION, cwd=cwd,
                      home=tmp_path / "home", args=("--max-turns", "3"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["is_error"] is False and result["subtype"] == "success"
    assert result["result"] == f"The file says {token}."
    assert result["num_turns"] == 2  # the tool call (a toolu_ id) and its tool_result came back
    usage = result["usage"]  # summed over both turns: the second started from the first's KV
    assert usage["cache_read_input_tokens"] > 0.4 * (usage["input_tokens"]
                                                     + usage["cache_read_input_tokens"])
    first = plugin.prompts[seen]
    assert len(plugin.prompts) == seen + 2
    # its system-role message is a system turn of its own, after the user's question
    assert first.index(QUESTION) < first.index("<|im_start|>system\n# Environment")
    assert "x-anthropic-billing-header" not in first and "cc_version=" not in first


def test_claude_code_billing_header_does_not_break_the_prefix_cache(server, npm_clients,
                                                                   tmp_path):
    """Claude Code's billing header names its entry point and a hash of the first prompt;
    from another entry point (the TypeScript SDK's) the same conversation differs only
    there. Dropped, the second run reads the first one's whole prompt from the cache."""
    srv, plugin = server
    plugin.reply = lambda prompt: "Hi."
    runs = []
    for entrypoint in ("sdk-cli", "sdk-ts"):
        done = run_claude(npm_clients["claude"], srv.base_url, "Say hi.", cwd=tmp_path,
                          home=tmp_path / "home", args=("--max-turns", "1"),
                          env={"CLAUDE_CODE_ENTRYPOINT": entrypoint})
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        runs.append(json.loads(done.stdout))
    assert [r["result"] for r in runs] == ["Hi.", "Hi."]
    usage = runs[1]["usage"]
    assert usage["cache_read_input_tokens"] > 0.9 * (usage["input_tokens"]
                                                     + usage["cache_read_input_tokens"])


def test_codex_runs_a_command(server, npm_clients, work, tmp_path):
    srv, plugin = server
    cwd, token = work
    plugin.reply = scripted_agent(token, json.dumps({"name": "exec_command",
                                                     "arguments": {"cmd": "cat hello.txt"}}))
    seen = len(plugin.prompts)
    # no sandbox: the scripted command only reads the test's own file, and CI containers
    # may not allow the user namespaces Codex's sandbox needs
    done, events = run_codex(npm_clients["codex"], srv.v1, QUESTION, cwd=cwd,
                             home=tmp_path / "home", args=("--sandbox", "danger-full-access"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    items = [e["item"] for e in events if e.get("type") == "item.completed"]
    commands = [i for i in items if i["type"] == "command_execution"]
    assert len(commands) == 1 and commands[0]["exit_code"] == 0
    assert token in commands[0]["aggregated_output"]
    assert [i["text"] for i in items if i["type"] == "agent_message"] == [
        f"The file says {token}."]
    assert not [e for e in events if e.get("type") in ("turn.failed", "error")]
    usage = [e for e in events if e.get("type") == "turn.completed"][0]["usage"]
    assert usage["cached_input_tokens"] > 0.4 * usage["input_tokens"]
    first = plugin.prompts[seen]
    assert len(plugin.prompts) == seen + 2
    # its developer messages lead the prompt as the system turn, before the user turns
    system = first[:first.index("<|im_start|>user")]
    assert system.startswith("<|im_start|>system\n") and "Codex CLI" in system


@pytest.fixture(scope="module")
def batch_server():
    """The same tiny model on the batch lane (four rows; a script per row)."""
    with scripted_server("", name="scripted-clients-batch", seed=4546, batch=4,
                         **long_context_options()) as (srv, plugin):
        yield srv, plugin


def test_two_claude_code_sessions_and_codex_at_once_on_the_batch_lane(
        batch_server, npm_clients, tmp_path, caplog):
    """Three agents in their own directories, each with its own file: every one gets its
    tool call, its own file's content back and an answer quoting it, while their requests
    share decode steps of one batch."""
    srv, plugin = batch_server
    sessions = []
    for i, kind in enumerate(("claude", "claude", "codex")):
        cwd = tmp_path / f"agent{i}"
        cwd.mkdir()
        token = f"mlxbun-{uuid.uuid4().hex[:12]}"
        (cwd / "hello.txt").write_text(token + "\n", encoding="utf-8")
        call = ({"name": "Read", "arguments": {"file_path": str(cwd / "hello.txt")}}
                if kind == "claude" else
                {"name": "exec_command", "arguments": {"cmd": "cat hello.txt"}})
        sessions.append((kind, cwd, token, json.dumps(call)))

    def reply(prompt: str) -> str:  # which session's prompt: its file's token, else its cwd
        for _, _, token, _ in sessions:
            if token in prompt:
                return f"The file says {token}."
        for _, cwd, _, call in sessions:
            if f"{cwd}\n" in prompt or f"{cwd}<" in prompt or f"{cwd} " in prompt:
                return "<tool_call>" + call + "</tool_call>"
        return "Which session is this?"

    plugin.reply = reply
    lane = srv.engine.worker.lanes[0]
    steps, rows = lane.steps.steps, lane.steps.rows
    caplog.set_level(logging.INFO, logger="mlxbun.engine")

    def run(session):
        kind, cwd, token, _ = session
        home = tmp_path / f"home-{cwd.name}"
        if kind == "claude":
            done = run_claude(npm_clients["claude"], srv.base_url, QUESTION, cwd=cwd,
                              home=home, args=("--max-turns", "3"))
            return done, json.loads(done.stdout)["result"] if done.returncode == 0 else None
        done, events = run_codex(npm_clients["codex"], srv.v1, QUESTION, cwd=cwd, home=home,
                                 args=("--sandbox", "danger-full-access"))
        said = [e["item"]["text"] for e in events if e.get("type") == "item.completed"
                and e["item"]["type"] == "agent_message"]
        return done, said[-1] if said else None

    with ThreadPoolExecutor(len(sessions)) as pool:
        results = list(pool.map(run, sessions))
    for (kind, _, token, _), (done, answer) in zip(sessions, results):
        assert done.returncode == 0, kind + done.stdout[-2000:] + done.stderr[-2000:]
        assert answer == f"The file says {token}.", kind
    finished = [r.getMessage() for r in caplog.records if "tok out" in r.getMessage()]
    assert len(finished) == 6 and all("· batched lane ·" in m for m in finished), finished
    assert lane.steps.rows - rows > lane.steps.steps - steps  # some steps carried 2+ rows


def test_claude_code_on_the_embedded_default_with_its_stretched_window(smollm2_path,
                                                                      npm_clients, tmp_path):
    """`mlxbun serve` with nothing named, as `make serve` runs it: SmolLM2-135M with its
    trained 8,192-token window stretched to 32,768. One short exchange through Claude
    Code, bare (its own system prompt, environment block and tools are 12k tokens, minutes
    to read on a CPU: bench/NOTES.md has that run): the real model, its RoPE stretched,
    answers through the real client."""
    with serve("--no-open", env={"MLXBUN_CONTEXT_LENGTH": ""}) as proc:
        assert "context 32768 tokens (8192 native, YaRN x4)" in proc.output
        row = httpx.get(proc.base + "/v1/models", timeout=30).json()["data"][0]
        assert (row["id"], row["context_window"]) == ("SmolLM2-135M-Instruct", 32768)
        done = run_claude(npm_clients["claude"], proc.base,
                          "What is the capital of France?", cwd=tmp_path,
                          home=tmp_path / "home", max_output_tokens=24,
                          args=("--bare", "--max-turns", "1", "--tools", "",
                                "--system-prompt", "You are a helpful assistant."))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["is_error"] is False and "Paris" in result["result"]
