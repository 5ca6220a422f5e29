"""mlxbun: a plugin-based LLM inference server on MLX."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mlxbun")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0"

from . import plugins  # noqa: F401  (wires LoadedModel.hooks to the plugin routing)
from .hookspecs import hookimpl  # re-exported for plugin authors

__all__ = ["hookimpl", "__version__"]

from . import blas as _blas
from . import fdlimit as _fdlimit

_blas.install()  # MLX's CPU matrix products on OpenBLAS, from the moment mlx.core loads
_fdlimit.install()  # the open-file limit up to the hard one; mlx_lm.utils may not lower it
