"""The ``serve`` flags of the SSD tier, and the config they make."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..runconfig import current
from .config import DEFAULT_DEMOTE_IDLE_S, DEFAULT_QUEUE_BYTES, SsdConfig


def _positive_gb(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be a positive number of GB")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 (off) or a number of seconds")
    return value


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ssd-cache", default=os.environ.get("MLXBUN_SSD_CACHE") or None,
                   metavar="DIR",
                   help="keep prefix KV on disk under DIR too: entries leaving RAM are written "
                        "in the background and restored by a later request, also after a "
                        "restart (default: off)")
    p.add_argument("--ssd-cache-max", type=_positive_gb, default=None, metavar="GB",
                   help="byte cap of DIR in GiB; least recently used files go first "
                        "(default: min(50, a quarter of the free disk space))")
    p.add_argument("--ssd-cache-verify", action="store_true",
                   help="also write and check a BLAKE2b digest of every entry (the fast "
                        "xxh3 content hash is always checked)")
    p.add_argument("--ssd-demote-idle", type=_seconds, default=None, metavar="S",
                   help="write RAM entries unused for S seconds to disk and free their memory "
                        f"(default {DEFAULT_DEMOTE_IDLE_S:.0f} with --ssd-cache; 0: never)")
    p.add_argument("--generation-checkpoint", type=_tokens, default=None, metavar="N",
                   help="with --ssd-cache: snapshot a greedy or seeded generation every N "
                        "tokens it hands out; an identical retry (after a disconnect or a "
                        "restart) replays them and continues (default: off)")


def _tokens(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be a positive number of tokens")
    return value


def config_from_args(args) -> tuple[SsdConfig | None, str | None]:
    """``(config or None, problem or None)``; sub-flags without ``--ssd-cache`` warn."""
    every = getattr(args, "generation_checkpoint", None)
    if every and not args.ssd_cache:
        return None, ("--generation-checkpoint needs --ssd-cache DIR (its snapshots and "
                      "their KV live in the SSD tier)")
    if not args.ssd_cache:
        if args.ssd_cache_max is not None or args.ssd_cache_verify \
                or args.ssd_demote_idle is not None:
            print("mlxbun: --ssd-cache-max/--ssd-cache-verify/--ssd-demote-idle need "
                  "--ssd-cache; ignored", file=sys.stderr)
        return None, None
    if getattr(args, "prompt_cache", 1) <= 0:
        return None, "--ssd-cache needs the RAM prompt cache (--prompt-cache above 0)"
    write_behind = current().cache.ssd_write_behind
    idle = DEFAULT_DEMOTE_IDLE_S if args.ssd_demote_idle is None else args.ssd_demote_idle
    return SsdConfig(dir=Path(args.ssd_cache).expanduser(),
                     max_bytes=int(args.ssd_cache_max * (1 << 30)) if args.ssd_cache_max else None,
                     verify=bool(args.ssd_cache_verify), demote_idle_s=idle,
                     write_behind=write_behind, queue_bytes=DEFAULT_QUEUE_BYTES,
                     checkpoint_every=every or 0), None
