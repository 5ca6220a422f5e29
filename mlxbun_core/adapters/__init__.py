"""LoRA adapters: read mlx-lm and PEFT adapter directories, mount them on a served
model through its worker, resolve a request's ``adapter`` spec, and activate an
adapter set on the model only while rows that asked for it run."""

from .manager import AdapterManager
from .sets import NO_ADAPTERS, AdapterSet, Mounted

__all__ = ["NO_ADAPTERS", "AdapterManager", "AdapterSet", "Mounted"]
