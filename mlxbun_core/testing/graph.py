"""What MLX will run for a graph: its primitives counted by kind, before any evaluation."""

from __future__ import annotations

import collections
import re
import tempfile
from typing import Any


def primitives(*arrays: Any) -> dict[str, int]:
    """The primitives of the graph behind ``arrays`` (not yet evaluated), by kind, most
    first: what MLX encodes one by one (``mx.export_to_dot``'s rectangles)."""
    import mlx.core as mx

    with tempfile.NamedTemporaryFile("r", suffix=".dot") as f:
        mx.export_to_dot(f.name, *arrays)
        text = f.read()
    kinds = re.findall(r'label ="([^"]+)", shape=rectangle', text)
    return dict(collections.Counter(kinds).most_common())
