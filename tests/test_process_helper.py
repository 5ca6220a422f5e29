"""The subprocess helper every `mlxbun serve` test reads through: it fails, never hangs."""

import sys
import time

import pytest

from mlxbun_core.testing.process import ServerProcess


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
