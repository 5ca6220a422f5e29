"""The global random stream the samplers draw from: made fresh after a failure inside a
compiled sampler, and moved past the draws a resumed seeded generation already made."""

from __future__ import annotations

import os


def fresh_random_state() -> None:
    import mlx.core as mx

    mx.random.seed(int.from_bytes(os.urandom(8), "little"))


def skip_draws(n: int) -> None:
    """Advance the global random stream past ``n`` draws (a seeded sampler draws one key
    a token), so a resumed seeded generation samples what its first run would have."""
    if n <= 0:
        return
    import mlx.core as mx

    for _ in range(n):
        mx.random.uniform(shape=(1,))  # (one key from the global stream, as a sample takes)
    mx.eval(mx.random.state)
