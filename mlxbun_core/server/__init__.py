"""HTTP surfaces: one module per protocol, all over the same engine."""
