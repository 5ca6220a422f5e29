"""Forced-token fill (``MLXBUN_FILL=strict``): the tokens a grammar leaves no choice
about ride along in the next forward pass instead of costing a decode step each.

``policy`` says who may fill and keeps the ``/stats`` counters; ``forced`` finds a
request's forced runs; ``decode`` is the serial lane's decode loop with runs; ``rows``
feeds runs through the batch lane's shared step.
"""

from .forced import FillSession
from .policy import FillPolicy, parse_mode

__all__ = ["FillPolicy", "FillSession", "parse_mode"]
