"""A process that ran the engine exits with its own status, not an abort: a script that
generated and closed its engine exits 0, and so does ``mlxbun serve`` stopped by Ctrl-C.

The abort these guard against ("terminate called without an active exception", exit
134) came from MLX's per-thread random key, whose native destructor takes the GIL when
the worker's OS thread ends; see ``engine.worker.release_thread_mlx``."""

from __future__ import annotations

import signal

import openai

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.exit_probe import can_linger, run_exit_probe
from mlxbun_core.testing.process import serve

ABORT = "terminate called"


def test_a_script_that_generated_and_closed_its_engine_exits_zero():
    """Load, one sampled and one seeded request, ``close()``, return from main, with the
    worker's OS thread made to reach MLX's thread-exit destructors only once the
    interpreter is finalizing: the order that aborted at random before, made certain
    (glibc only; elsewhere the plain race). Exit 0: the worker let go of MLX's
    per-thread state while it still held the GIL."""
    done = run_exit_probe(tiny_checkpoint("qwen3"), slow_thread_exit=can_linger())
    assert done.returncode == 0 and ABORT not in done.stderr, done.stdout + done.stderr
    assert "generated ['length', 'length']" in done.stdout and "closed" in done.stdout


def test_serve_stopped_by_sigint_after_a_request_exits_zero():
    """One sampled completion answered, then Ctrl-C: exit 0 and the drain's line last."""
    with serve(tiny_checkpoint("qwen3"), "--no-open", ready=None) as server:
        base = server.base
        assert server.wait_for_http(base + "/health", timeout=60).status_code == 200
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", timeout=60)
        done = client.completions.create(model="m", prompt="Hello", max_tokens=4,
                                         temperature=1.0)
        assert done.choices[0].finish_reason == "length"
        _until_no_lane_is_active(base)  # (the lane stores the reply's cache after its Done)
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(timeout=30) == 0, server.output
        server.wait_for_line("shutting down", timeout=5)
        lines = [line for line in server.lines if line.strip()]
        assert ABORT not in server.output and "Traceback" not in server.output, server.output
        assert "draining 0 active and 0 waiting" in lines[-1], server.output


def _until_no_lane_is_active(base: str, timeout: float = 30.0) -> None:
    import time

    import httpx

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        lanes = httpx.get(base + "/stats", timeout=10).json()["batch"]["lanes"]
        if not any(lane["active"] or lane["waiting"] for lane in lanes.values()):
            return
        time.sleep(0.05)
    raise AssertionError(f"a lane stayed busy for {timeout} s: {lanes}")
