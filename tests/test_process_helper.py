"""The subprocess helper every `mlxbun serve` test reads through: it fails, never hangs."""

import sys
import time

import pytest

from mlxbun_core.testing.process import ServerProcess, serve


def test_silent_server_fails_the_test_instead_of_hanging():
    """A process that prints nothing fails within the deadline."""
    cmd = [sys.executable, "-c", "import time; print('starting', flush=True); time.sleep(60)"]
    with ServerProcess(cmd) as proc:
        assert proc.wait_for_line("starting", timeout=30) == "starting\n"
        t0 = time.monotonic()
        with pytest.raises(AssertionError, match="no line with 'serving' within 1s"):
            proc.wait_for_line("serving", timeout=1)
        assert time.monotonic() - t0 < 5
    assert proc.proc.poll() is not None  # stopped on leaving the block
    with (ServerProcess([sys.executable, "-c", "print('bye')"]) as proc,
          pytest.raises(AssertionError, match="process ended")):
        proc.wait_for_line("serving", timeout=30)


def test_wait_until_fails_on_exit_and_at_the_deadline():
    """The condition poll every isolate fixture waits through: a false check fails at
    the deadline, a process that ends fails at once; both carry the output."""
    cmd = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]
    with ServerProcess(cmd) as proc:
        proc.wait_for_line("up", timeout=30)
        proc.wait_until(lambda: True, "nothing", timeout=1)
        t0 = time.monotonic()
        with pytest.raises(AssertionError, match="timed out .* waiting for never(.|\n)*up"):
            proc.wait_until(lambda: False, "never", timeout=0.5)
        assert time.monotonic() - t0 < 5
    with (ServerProcess([sys.executable, "-c", "print('bye')"]) as proc,
          pytest.raises(AssertionError, match="exited \\(rc=0\\) while waiting for a ready")):
        proc.wait_for_engine(timeout=30)


def test_serve_stops_a_server_that_never_comes_up():
    """A refused start-up fails the wait at once, with what serve said."""
    with pytest.raises(AssertionError, match="no-such-flag") as failed:
        serve("--no-such-flag", timeout=60)
    assert "did not answer" in str(failed.value)
