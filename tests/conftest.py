import pytest


@pytest.fixture(scope="session")
def smollm2_path():
    """SmolLM2-135M-Instruct converted once per session (via the default-model path) into the
    session's temporary MLXBUN_HOME (mlxbun_core.testing.home), which every test and
    subprocess shares: a bare `mlxbun serve` in a test finds this conversion.

    The returned dir lives at <home>/converted/<name>; tests may call
    `resolve_model(None, cache_dir=smollm2_path.parent.parent)` to hit the same cache.
    Under pytest-xdist the workers share one conversion (hard links; testing.home).
    """
    from mlxbun_core.testing.home import default_conversion

    return default_conversion()


@pytest.fixture(scope="session")
def smollm2_server(smollm2_path):
    """One running server on the real default model, shared by the tests that need real
    answers (loading it and building its grammar tokenizer once saves tens of seconds)."""
    from mlxbun_core.testing.server import start_server

    s = start_server(smollm2_path)
    yield s
    s.stop()
