"""Memory vault speed: writes (file + revision + FTS5 reindex of the article), a full reindex,
and search latency over a vault of synthetic articles. No model; runs anywhere.

    .venv/bin/python bench/memory_vault.py --articles 2000 --searches 200
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from mlxbun_core.memory import articles
from mlxbun_core.memory.vault import Vault

WORDS = ("kiwi vitamin rust borrow checker cache prefix batch lane token model grammar schema "
         "vault index search article history revision diff memory engine sampler").split()


def sentence(rng: random.Random, n: int = 12) -> str:
    return " ".join(rng.choice(WORDS) + str(rng.randrange(500)) for _ in range(n))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--articles", type=int, default=2000)
    ap.add_argument("--facts", type=int, default=20, help="fact lines per article")
    ap.add_argument("--searches", type=int, default=200)
    args = ap.parse_args()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        vault = Vault(Path(tmp) / "wiki")
        vault.setup()
        t0 = time.perf_counter()
        for i in range(args.articles):
            text = articles.render(f"Topic {i}", sentence(rng),
                                   [sentence(rng) for _ in range(args.facts)],
                                   [f"Topic_{rng.randrange(args.articles)}"])
            vault.write(f"Topic_{i}", text, "bench")
        write_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        vault.reindex()
        reindex_s = time.perf_counter() - t0
        times = []
        for _ in range(args.searches):
            q = f"{rng.choice(WORDS)}{rng.randrange(500)} {rng.choice(WORDS)}"
            t0 = time.perf_counter()
            vault.search(q, "all", 50)
            times.append((time.perf_counter() - t0) * 1000)
        size = vault.index.path.stat().st_size + vault.history.path.stat().st_size
    times.sort()
    per_write_ms = write_s / args.articles * 1000
    print(f"articles {args.articles} x {args.facts} facts: write {per_write_ms:.2f} ms/article"
          f", full reindex {reindex_s:.2f} s, .vault {size / 2**20:.1f} MiB")
    print(f"search over {args.searches} queries: median {statistics.median(times):.2f} ms, "
          f"p95 {times[int(len(times) * 0.95)]:.2f} ms")


if __name__ == "__main__":
    main()
