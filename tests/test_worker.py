"""The worker thread survives its lanes: a failure outside any one job ends that lane's
jobs with an error and the next request is served."""

from __future__ import annotations

import pytest

from mlxbun_core.errors import APIError
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close, engines, greedy, run_all, token_ids, within


def test_a_lane_step_that_fails_outside_any_job_harms_no_later_request(monkeypatch):
    """A bug in lane bookkeeping (here: admission raising once) ends that lane's jobs with
    an error instead of killing the worker; the next request is served normally."""
    from mlxbun_core.engine.lanes.batch import BatchLane

    batched, serial = engines(tiny_checkpoint("llama"))
    try:
        real, calls = BatchLane._admit, []

        def flaky(self):
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("bookkeeping bug")
            return real(self)

        monkeypatch.setattr(BatchLane, "_admit", flaky)
        with pytest.raises(APIError, match="bookkeeping bug"):  # the request's own error
            within(60, lambda: run_all(batched, [greedy("Hello there", 5)]))
        body = greedy("Hello there", 5)
        got = within(60, lambda: run_all(batched, [body])[0])
        assert token_ids(got) == token_ids(run_all(serial, [body])[0])
    finally:
        close(batched, serial)


def test_close_returns_once_the_worker_has_stopped():
    """``Engine.close()`` waits for the worker thread: a script (a bench, a library user)
    that generated, closed and exited while the thread was still inside MLX aborted at
    exit ("terminate called without an active exception", exit 134)."""
    from mlxbun_core.engine.core import Engine

    engine = Engine.load(str(tiny_checkpoint("llama")), progress=False, batch=4)
    assert len(run_all(engine, [greedy("Hello there", 24), greedy("And you", 24)])) == 2
    engine.close()
    assert not engine.worker._thread.is_alive()
