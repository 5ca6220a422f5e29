"""``mlxbun cache explain``: why a running server's last requests hit its prefix cache as
far as they did, read from its ``/stats`` (``prompt_cache.recent``).

It finds the server as ``mlxbun chat`` does (``--url``, else ``--host`` and ``--port``,
``MLXBUN_PORT``, 8080) and sends ``MLXBUN_API_KEY`` when that is set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

REASONS = {
    "exact": "the whole prompt was cached",
    "within": "the prompt lies inside a cached entry",
    "extends": "the prompt extends a cached entry",
    "diverged": "the prompt left the best entry",
    "evicted": "an evicted entry shared more",
    "namespace": "another namespace shared more",
    "ssd": "restored from the SSD tier",
    "empty": "no entry for this model",
    "short": "the prompt is too short to cache",
}
NOTES = {"below-min": "too few shared tokens to reuse",
         "no-rewind": "the entry cannot be cut back to there (recurrent layers)"}


def add_parsers(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("cache", help="the prefix cache of a running server")
    verbs = c.add_subparsers(dest="cache_command", required=True)
    e = verbs.add_parser("explain", help="why the last requests hit the prefix cache as "
                                         "far as they did")
    e.add_argument("-n", type=int, default=10, metavar="N",
                   help="the last N requests (default: %(default)s)")
    e.add_argument("--url", default=None, help="the server (http://HOST:PORT)")
    e.add_argument("--host", default="127.0.0.1",
                   help="where it runs when no --url (default: %(default)s)")
    e.add_argument("--port", type=int, default=None,
                   help="its port (default: MLXBUN_PORT, else 8080)")
    e.add_argument("--json", action="store_true", help="one JSON object per request")


def cmd_cache(args: argparse.Namespace) -> int:
    import httpx  # (here: the other verbs start without it)

    from .finder import PROBE_TIMEOUT_S, default_port

    base = (args.url or f"http://{args.host}:{args.port or default_port()}").rstrip("/")
    base = base.removesuffix("/v1")
    key = os.environ.get("MLXBUN_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        resp = httpx.get(base + "/stats", headers=headers, timeout=PROBE_TIMEOUT_S * 5)
        resp.raise_for_status()
        cache = resp.json()["prompt_cache"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        print(f"mlxbun: no prefix-cache report from {base}/stats ({exc})", file=sys.stderr)
        return 1
    rows = cache.get("recent", [])[-max(args.n, 0):] if args.n > 0 else []
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    print(summary(cache))
    for row in rows:
        print("\n".join(describe(row)))
    return 0


def summary(cache: dict[str, Any]) -> str:
    if not cache.get("enabled"):
        return "prefix cache: off"
    evicted = ", ".join(f"{k} {v}" for k, v in sorted(cache.get("evicted", {}).items()))
    return (f"prefix cache: {cache['entries']} entries, {cache['bytes'] / 2**20:.1f} of "
            f"{cache['max_bytes'] / 2**20:.0f} MiB; {cache['hits']} hits of "
            f"{cache['lookups']} lookups" + (f"; evicted: {evicted}" if evicted else ""))


def describe(row: dict[str, Any]) -> list[str]:
    """One request's lines: what hit, why, and the text around a divergence."""
    when = time.strftime("%H:%M:%S", time.localtime(row["time"]))
    reason = row["reason"]
    why = REASONS.get(reason, reason)
    if "at" in row and reason in ("diverged", "evicted", "namespace"):
        why += f" at token {row['at']}"
    if reason == "namespace":
        why += f" (differs in {', '.join(row.get('namespace', []))})"
    if reason == "evicted":
        ago = max(0, round(row["time"] - row.get("evicted_at", row["time"])))
        why += f" (by {row.get('by')}, {ago} s before)"
    if "note" in row:
        why += f"; {NOTES.get(row['note'], row['note'])}"
    lines = [f"{when}  {row['lane']:<8} hit {row['hit_tokens']}/{row['prompt_tokens']}  "
             f"{reason}: {why}"]
    for side in ("before", "prompt", "cached"):
        text = row.get("text", {}).get(side)
        if text is not None:
            lines.append(f"    {side:>6}: {json.dumps(text, ensure_ascii=False)}")
    return lines
