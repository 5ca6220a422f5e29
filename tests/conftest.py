import pytest


@pytest.fixture(scope="session")
def smollm2_path(tmp_path_factory):
    """SmolLM2-135M-Instruct converted once per session (via the default-model path) into a tmp home.

    The returned dir lives at <home>/converted/<name>; tests may call
    `resolve_model(None, cache_dir=smollm2_path.parent.parent)` to hit the same cache.
    """
    from mlxbun_core.models.resolve import resolve_model

    return resolve_model(None, cache_dir=tmp_path_factory.mktemp("mlxbun_home"), progress=False).path
