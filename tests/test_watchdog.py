"""The distributed watchdog (mlxbun_core/distributed/watchdog.py) on its own: a rank that
stops answering makes rank 0 exit, whatever else fails on the way out."""

from __future__ import annotations

import sys
import threading
from types import SimpleNamespace

from mlxbun_core.distributed.watchdog import EXIT_STATUS, Watchdog


class _Worker:
    lanes = ()

    def post(self, fn):
        threading.Thread(target=fn, daemon=True).start()


class _Engine:
    worker, unavailable = _Worker(), None

    def abort(self, message):
        self.aborted = message


class _GoneStderr:
    def write(self, _):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")


def test_a_ping_that_never_returns_exits_even_with_the_launcher_gone(monkeypatch):
    """The ping blocks for good (a peer stopped without closing its sockets) and stderr is a
    pipe whose reader (mlx.launch) is gone: rank 0 still exits with status 3."""
    codes: list[int] = []
    exited = threading.Event()
    group = SimpleNamespace(alive=True, problem=None, last_ping_ms=None)
    engine = _Engine()
    monkeypatch.setattr(sys, "stderr", _GoneStderr())
    dog = Watchdog(group, lambda: threading.Event().wait(), engine, interval=0.05, timeout=0.3,
                   exit=lambda code: (codes.append(code), exited.set()))
    dog.start()
    assert exited.wait(10), "the watchdog never exited"
    assert codes == [EXIT_STATUS] and dog.broken and group.alive is False
    assert "did not answer" in engine.unavailable
