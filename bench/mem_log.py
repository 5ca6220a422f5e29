"""MEMLOG=SECONDS: a server started by the benches logs MLX's memory that often (active,
cache, peak, the device's free memory, and on CUDA what the driver's pool keeps
unused) on stderr, to see where a device's memory went."""

from __future__ import annotations

import os
import sys
import threading
import time


def start() -> None:
    every = float(os.environ.get("MEMLOG") or 0)
    if every <= 0:
        return

    def loop() -> None:
        import mlx.core as mx

        from mlxbun_core.engine.cuda_pool import pool_slack

        g = 2**30
        while True:
            time.sleep(every)
            free = mx.device_info().get("free_memory", 0)
            print(f"[mem] active {mx.get_active_memory() / g:.2f} cache "
                  f"{mx.get_cache_memory() / g:.2f} peak {mx.get_peak_memory() / g:.2f} "
                  f"free {free / g:.2f} pool slack {(pool_slack() or 0) / g:.2f} GiB",
                  file=sys.stderr, flush=True)

    threading.Thread(target=loop, daemon=True, name="mem-log").start()
