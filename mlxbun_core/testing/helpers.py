"""Small helpers the core's and the plugins' test suites share: mlx-lm's own greedy
tokens (the parity reference), one chat asked streamed and not, a plugin taken out for a
block, environment variables set for a block, the ``mlxbun plugins`` listing, whether
a text is JSON, calls released at once, and a prompt of an exact token count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any


def mlx_lm_greedy(model, prompt: list, n: int, stops: Iterable[int]) -> list[int]:
    """The tokens mlx-lm's ``generate_step`` picks greedily after ``prompt`` (token ids):
    at most ``n``, the first of ``stops`` (EOS ids) included."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    stops = set(stops)
    out = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=n):
        out.append(int(token))
        if token in stops:
            break
    return out


def chat_both_ways(client, **kw) -> tuple:
    """``(full, chunks)``: the chat completion ``kw`` asked once whole and once streamed
    (the official OpenAI client), after checking what must hold for any model: an
    assistant turn within ``max_tokens``, and the stream saying what the whole answer
    says (role first, the same content, reasoning and finish reason)."""
    full = client.chat.completions.create(**kw)
    choice, msg = full.choices[0], full.choices[0].message
    assert full.object == "chat.completion" and msg.role == "assistant"
    assert choice.finish_reason in ("length", "stop", "tool_calls")
    assert full.usage.completion_tokens <= kw["max_tokens"]
    chunks = list(client.chat.completions.create(stream=True, **kw))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert deltas[0].role == "assistant"
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason
    assert "".join(d.content or "" for d in deltas) == (msg.content or "")
    assert "".join((d.model_extra or {}).get("reasoning") or "" for d in deltas) == (
        (msg.model_extra or {}).get("reasoning") or "")
    return full, chunks


@contextmanager
def unregistered(name: str) -> Iterator[None]:
    """Plugin ``name`` taken out for the block (its checkpoints fall to the others), then
    registered again as it was, its listing entry included."""
    from .. import plugins

    plugin = plugins.load_plugins().get_plugin(name)
    assert plugin is not None, f"plugin {name!r} is not registered"
    info = dict(plugins.plugin_info.get(name, {}))
    plugins.unregister(name)
    try:
        yield
    finally:
        plugins.register(plugin, name)
        plugins.plugin_info[name] = info


def plugins_listing(**env: str) -> str:
    """What ``mlxbun plugins`` prints, run as a fresh process with ``env`` added."""
    cmd = [sys.executable, "-m", "mlxbun_core.cli", "plugins"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env}).stdout


def parses_json(text: str) -> bool:
    """Whether ``text`` is one JSON value."""
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@contextmanager
def environ(unset: Iterable[str] = (), **values: str) -> Iterator[None]:
    """``os.environ`` with ``values`` set and the names in ``unset`` removed for the block,
    all put back after (a server fixture whose jobs and subprocesses read the home, or
    the hub settings, from the environment)."""
    saved = {k: os.environ.get(k) for k in {*unset, *values}}
    for k in unset:
        os.environ.pop(k, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def together(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls at once (one thread each, released together); their results."""
    start = threading.Barrier(len(calls))

    def run(call: Callable[[], Any]) -> Any:
        start.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(run, c) for c in calls]]


def prompt_of(tok: Any, n: int) -> str:
    """Text that encodes to exactly ``n`` tokens with ``tok``."""
    ids = [tok.encode(" a", add_special_tokens=False)[-1]] * n
    text = tok.decode(ids)
    assert len(tok.encode(text)) == n
    return text


class OffsetCache:
    """A KV cache reduced to its offset: forwards advance it, speculation's trims take it
    back (stand-in models that need no real state: a bigram table, a recorded reply)."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        self.offset -= n
        return n


def configure(monkeypatch: Any, **groups: dict[str, Any]) -> Any:
    """The run configuration with some fields changed until the test ends: what a test
    sets instead of an ``MLXBUN_*`` variable, which nothing below start-up reads
    (``configure(monkeypatch, engine={"prefill_buckets": "on"})``)."""
    from .. import runconfig

    config = runconfig.current().changed(**groups)
    monkeypatch.setattr(runconfig, "_installed", config)
    return config


def stderr_records(capfd: Any, parse: Callable[[str], list[Any]], n: int,
                   timeout: float = 30.0) -> list[Any]:
    """What ``parse`` finds in this process's stderr once it holds ``n`` records (or the
    ``timeout`` passed): a trace record is written as its request ends, which can come
    just after the client has read the last byte."""
    import time

    text, deadline = "", time.monotonic() + timeout
    while True:
        text += capfd.readouterr().err
        found = parse(text)
        if len(found) >= n or time.monotonic() > deadline:
            return found
        time.sleep(0.05)
