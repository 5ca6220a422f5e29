"""mlxbun: a plugin-based LLM inference server on MLX."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mlxbun")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0"

from .hookspecs import hookimpl  # noqa: E402  (re-exported for plugin authors)
from . import plugins  # noqa: E402,F401  (wires LoadedModel.hooks to the plugin routing)

__all__ = ["hookimpl", "__version__"]

from . import blas as _blas  # noqa: E402

_blas.install()  # MLX's CPU matrix products on OpenBLAS, from the moment mlx.core loads
