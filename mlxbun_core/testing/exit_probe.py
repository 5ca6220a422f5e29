"""A process that uses an :class:`Engine` and exits, for tests of how it exits.

MLX keeps per-thread state (the thread's random key, streams, compile cache) whose
native destructors run when the OS thread ends, which is after ``Thread.join()`` has
returned. The random key's takes the GIL: if the main thread is finalizing the
interpreter by then, CPython ends that thread with ``pthread_exit`` from inside a ``noexcept``
destructor and the process aborts ("terminate called without an active exception",
status 134). How often that happens depends on the race, so ``slow_thread_exit`` makes
it certain: the worker's OS thread waits before reaching MLX's destructors (a native
thread-exit hook registered after them runs before them), while the interpreter's
teardown waits for that thread to be gone. A process whose worker leaves no such
destructor behind exits 0 either way.

    python -m mlxbun_core.testing.exit_probe CHECKPOINT [--slow-thread-exit]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

SLOW_EXIT_S = 0.2  # how long the worker's OS thread lingers before MLX's destructors
TEARDOWN_WAIT_S = 5.0  # at most this long the interpreter's teardown waits for that thread


def run_exit_probe(checkpoint: str | Path, *, slow_thread_exit: bool = False,
                   timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the probe on ``checkpoint`` in a fresh interpreter; its exit status and output."""
    cmd = [sys.executable, "-m", "mlxbun_core.testing.exit_probe", str(checkpoint)]
    if slow_thread_exit:
        cmd.append("--slow-thread-exit")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def linger_at_thread_exit(seconds: float) -> None:
    """Make the calling OS thread sleep ``seconds`` at its exit, before the native
    thread-exit destructors registered so far (glibc runs them last in, first out)."""
    libc = ctypes.CDLL(None)
    register = libc.__cxa_thread_atexit_impl
    register.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    usleep = ctypes.cast(libc.usleep, ctypes.c_void_p)
    # usleep(microseconds) takes its argument where a destructor gets its object; the third
    # argument names the library the hook lives in (libc: usleep's own address)
    if register(usleep, ctypes.c_void_p(int(seconds * 1e6)), usleep) != 0:
        raise OSError("__cxa_thread_atexit_impl refused the hook")


def can_linger() -> bool:
    """Whether ``slow_thread_exit`` works here (glibc's thread-exit hooks, Linux's /proc)."""
    try:
        return (os.path.isdir("/proc/self/task")
                and hasattr(ctypes.CDLL(None), "__cxa_thread_atexit_impl"))
    except OSError:
        return False


class _WaitForThreadAtTeardown:
    """Held by a module global: the interpreter drops it while it finalizes, and its
    finalizer then waits (GIL released) until the OS thread ``tid`` is gone, so that
    thread's destructors run while the interpreter is finalizing rather than after the
    process has ended."""

    def __init__(self, tid: int):
        # what the finalizer needs, held here: module globals may be gone by then
        self.task, self.exists = f"/proc/self/task/{tid}", os.path.exists
        self.sleep, self.now = time.sleep, time.monotonic
        self.wait_s = TEARDOWN_WAIT_S

    def __del__(self) -> None:
        deadline = self.now() + self.wait_s
        while self.exists(self.task) and self.now() < deadline:
            self.sleep(0.01)


_held: list[_WaitForThreadAtTeardown] = []


def _linger_here() -> int:
    """On the worker: make its exit slow; its OS thread id."""
    linger_at_thread_exit(SLOW_EXIT_S)
    return threading.get_native_id()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--slow-thread-exit", action="store_true")
    args = p.parse_args()

    from ..engine.core import Engine
    from .engine import run_all

    engine = Engine.load(args.checkpoint, progress=False, batch=4, prompt_cache_bytes=0)
    # sampled (the worker draws from MLX's random key) and seeded (it seeds that key)
    replies = run_all(engine, [{"prompt": "Hello there", "max_tokens": 4, "temperature": 1.0},
                               {"prompt": "Once", "max_tokens": 4, "temperature": 1.0,
                                "seed": 7}])
    print("generated", [r.finish.reason for r in replies], flush=True)
    if args.slow_thread_exit:
        tid = engine.worker.run_sync(_linger_here)
        _held.append(_WaitForThreadAtTeardown(tid))
    engine.close()
    print("closed", flush=True)


if __name__ == "__main__":
    main()
