"""On CUDA the kernels MLX compiles are kept in mlxbun's home (a reboot may empty MLX's
default under the temporary directory, and a 4-bit 8B's first start compiles for 95 s)."""

from __future__ import annotations

import os

import mlx.core as mx
import pytest

from mlxbun_core.backend import PTX_CACHE_ENV, keep_compiled_kernels


def test_cuda_keeps_compiled_kernels_in_the_home_per_mlx_version(tmp_path, monkeypatch):
    monkeypatch.delenv(PTX_CACHE_ENV, raising=False)
    got = keep_compiled_kernels(tmp_path, "cuda")
    assert got == str(tmp_path / "ptx" / mx.__version__)
    assert os.environ[PTX_CACHE_ENV] == got


@pytest.mark.parametrize("named", ["/somewhere/else", ""])
def test_a_directory_the_user_named_is_kept(named, tmp_path, monkeypatch):
    # an empty value is MLX's "keep no compiled kernels", not "unset"
    monkeypatch.setenv(PTX_CACHE_ENV, named)
    assert keep_compiled_kernels(tmp_path, "cuda") is None
    assert os.environ[PTX_CACHE_ENV] == named


@pytest.mark.parametrize("where", ["metal", "cpu"])
def test_other_backends_are_left_alone(where, tmp_path, monkeypatch):
    monkeypatch.delenv(PTX_CACHE_ENV, raising=False)
    assert keep_compiled_kernels(tmp_path, where) is None
    assert PTX_CACHE_ENV not in os.environ
