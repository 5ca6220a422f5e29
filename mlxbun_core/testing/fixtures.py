"""Pytest fixtures the core's and the plugins' suites share: a test module defines
``ckpt`` (the checkpoint to serve) and asks for ``srv`` or ``client``; ``backend`` runs
a test once per grammar backend; ``npm_clients`` installs the real CLI clients. The repository's
root ``conftest.py`` loads this module; an out-of-tree suite adds
``pytest_plugins = ["mlxbun_core.testing.fixtures"]`` to its own root conftest. A module
that needs a differently started server defines its own ``srv``, which wins. The plugin
also runs the whole session under a temporary ``MLXBUN_HOME`` and fails the run if the
user's real home changed (:mod:`.home`)."""

from __future__ import annotations

import subprocess

import pytest

from .home import pytest_configure, pytest_sessionfinish, pytest_unconfigure  # noqa: F401
from .server import start_server

# the conformance suite's checks are asserts in a library module: show their values too
pytest.register_assert_rewrite("mlxbun_core.testing.conformance")


@pytest.fixture(scope="module")
def srv(ckpt):
    """``ckpt`` served on a free loopback port for the module."""
    s = start_server(ckpt)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(srv):
    """The official OpenAI client for ``srv``, with no retries (a failure shows at once)."""
    import openai

    return openai.OpenAI(base_url=srv.v1, api_key="unused", max_retries=0)


@pytest.fixture(params=["llguidance", "xgrammar"])
def backend(request):
    """Each grammar backend in turn, selected for the test and restored after it."""
    from ..grammar_registry import registry

    before = registry.chosen
    registry.select(request.param)
    yield request.param
    registry.chosen = before


@pytest.fixture(scope="session")
def npm_clients(request):
    """``{"claude": path, "codex": path}``: the real CLIs from npm, installed once into
    the repository's git-ignored ``.npm-clients/`` (see :mod:`.clients`). Without npm
    the tests that ask for them fail, they are not skipped."""
    from .clients import install_clients

    try:
        return install_clients(request.config.rootpath)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"cannot install the real CLI clients: {exc}")
