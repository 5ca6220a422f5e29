"""``mlxbun download``, ``mlxbun upload``, ``mlxbun gc`` and ``mlxbun ls --all-revisions``.

The same job bodies and planner the server uses, in the foreground: a download is
recorded in the job store (so ``GET /downloads`` shows it too) with a tqdm bar fed
by the job's progress events.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parsers(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("download", aliases=["get"], help="download a model from the hub "
                       "(resumable; only what serving needs)")
    d.add_argument("repo", nargs="+", metavar="repo",
                   help="hub repo id (owner/name), or words without a '/' matching one "
                        "downloaded repo (`get 12B` refreshes it to upstream's latest)")
    d.add_argument("--revision", default="main", help="branch, tag or commit (default: main)")

    s = sub.add_parser("scan", help="index the HF cache and mlxbun's own models again "
                       "(config and safetensors headers only) and list what resolves")
    s.add_argument("--json", action="store_true", help="one JSON object per line")

    u = sub.add_parser("upload", help="push a model, adapter or dataset folder to the hub")
    u.add_argument("--path", required=True, help="the folder to upload")
    u.add_argument("--upload-repo", required=True, dest="repo", help="owner/name on the hub")
    u.add_argument("--private", action="store_true", help="create the repo private")
    u.add_argument("--dataset", action="store_true", help="push as a dataset repo")

    g = sub.add_parser("gc", help="reclaim disk: superseded snapshots, orphaned blobs, "
                                  "stale conversions and job leftovers")
    g.add_argument("--yes", "-y", action="store_true", help="delete without asking")
    g.add_argument("--dry-run", action="store_true", help="only print the plan")
    g.add_argument("--force", action="store_true",
                   help="also prune superseded snapshots holding files the kept revision lacks")


def _fail(message: str) -> int:
    print(f"mlxbun: {message}", file=sys.stderr)
    return 2


def downloaded_match(words: list[str]) -> str:
    """The one downloaded repo whose id holds every word (any case; an exact id wins).
    Raises LookupError saying why none, or which candidates, when not exactly one."""
    ids = sorted({r["repo_id"] for r in all_revisions()}, key=str.lower)
    query = " ".join(words)
    exact = [i for i in ids if i.lower() == query.lower()]
    hits = exact or [i for i in ids if all(w.lower() in i.lower() for w in words)]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise LookupError(f"no downloaded model matches {query!r} (a name without '/' refreshes "
                          f"a downloaded one; see `mlxbun ls {words[0]}`, or give owner/name)")
    raise LookupError(f"{query!r} matches {len(hits)} downloaded models: {', '.join(hits)}; "
                      "add a word or give owner/name")


def cmd_download(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ..errors import APIError
    from ..jobs.runner import JobManager
    from ..jobs.store import JobStore
    from ..models.paths import mlxbun_home
    from . import download
    from .jobs import RUNNERS

    words = [args.repo] if isinstance(args.repo, str) else list(args.repo)
    repo = words[0]
    if len(words) > 1 or "/" not in repo:
        try:
            repo = downloaded_match(words)
        except LookupError as exc:
            return _fail(str(exc))
        print(f"mlxbun: refreshing {repo} ({args.revision})", file=sys.stderr)
    before = {r["revision"] for r in all_revisions() if r["repo_id"] == repo}
    try:
        config = download.prepare({"repo": repo, "revision": args.revision})
    except APIError as exc:
        return _fail(exc.message)
    home = mlxbun_home()
    manager = JobManager(JobStore(home / "jobs.sqlite"), home, runners=RUNNERS)
    bars: list[tqdm] = []  # made on the first progress event: a failure before any shows none

    def show(event: dict[str, Any]) -> None:
        if event.get("type") == "stage" and "received_bytes" in event:
            if not bars:
                bars.append(tqdm(total=0, unit="B", unit_scale=True, unit_divisor=1024,
                                 dynamic_ncols=True, file=sys.stderr, desc=repo))
            bar = bars[0]
            bar.total = event["total_bytes"]
            bar.n = event["received_bytes"]
            bar.set_postfix_str(f"{event['files_done']}/{event['files_total']} "
                                f"{event.get('current_file') or ''}"[-50:], refresh=False)
            bar.refresh()  # a failure is said once, below, from the job's row

    try:
        row = manager.run("download", config, show)
    except KeyboardInterrupt:
        for bar in bars:
            bar.close()
        return _fail("interrupted: run the same command again to resume")
    for bar in bars:
        bar.close()
    if row["status"] != "done":
        return _fail(f"{repo}: {row['error']}")
    print(f"mlxbun: {repo} downloaded: {row['output_path']}")
    _say_superseded(repo, before)
    return 0


def _say_superseded(repo_id: str, before: set[str]) -> None:
    """When the download added a snapshot beside earlier ones: they stay; say what gc frees."""
    from ..library.report import human_bytes
    from . import gc

    now = {r["revision"] for r in all_revisions() if r["repo_id"] == repo_id}
    if not before or not (now - before):
        return
    freed = sum(i["bytes"] for i in gc.plan()["items"] if i["repo_id"] == repo_id)
    print(f"mlxbun: upstream moved on: a new snapshot of {repo_id}; the previous one stays "
          f"on disk (`mlxbun gc` would reclaim {human_bytes(freed)})")


def cmd_scan(args: argparse.Namespace) -> int:
    """``mlxbun scan``: what every query verb (``serve``, ``fit``, ``ls``, ``get NAME``)
    resolves against, read fresh from disk; a model no plugin serves is listed as such."""
    import json

    from ..library.report import human_bytes
    from ..library.scan import scan

    entries = scan()
    for e in entries:
        if args.json:
            print(json.dumps(e.row()))
        else:
            family = e.claim.family if e.claim else "not servable (no plugin claims it)"
            print(f"{e.id:<48} {e.source:<8} {human_bytes(e.size_bytes):>9}  {family}")
    if not args.json:
        served = sum(1 for e in entries if e.claim)
        print(f"mlxbun: {len(entries)} models indexed ({served} servable), "
              f"{human_bytes(sum(e.size_bytes for e in entries))} on disk")
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    from ..errors import APIError
    from ..jobs.events import JobError
    from . import push

    kind = "dataset" if args.dataset else "model"
    try:
        config = push.prepare({"repo_id": args.repo, "source_path": args.path,
                               "private": args.private}, kind, None)
        url = push.upload(config, lambda e: print(f"mlxbun: {e.get('stage')}: "
                                                  f"{e.get('message', '')}", file=sys.stderr))
    except (APIError, JobError) as exc:
        return _fail(getattr(exc, "message", str(exc)))
    print(f"mlxbun: uploaded {args.path} to {url}")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from ..library.report import human_bytes
    from . import gc

    plan = gc.plan(force=args.force)
    for item in plan["skipped"]:
        print(f"{'kept':>9}  {item['kind']:<11} {item['id']}  ({item['reason']})")
    if not plan["items"]:
        print("mlxbun: nothing to reclaim")
        return 0
    for item in plan["items"]:
        print(f"{human_bytes(item['bytes']):>9}  {item['kind']:<11} {item['id']}  "
              f"({item['reason']})")
    print(f"{human_bytes(plan['reclaim_bytes']):>9}  in all, {len(plan['items'])} items")
    if args.dry_run:
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            print("mlxbun: pass --yes to delete (nothing was deleted)")
            return 0
        if input("delete these? [y/N] ").strip().lower() not in ("y", "yes"):
            print("mlxbun: nothing deleted")
            return 0
    try:
        out = gc.execute(plan_id=plan["plan_id"], force=args.force)
    except gc.PlanChanged as exc:
        return _fail(f"{exc} (nothing was deleted)")
    print(f"mlxbun: deleted {out['snapshots']} snapshots and {out['blobs']} blobs and "
          f"{len(out['deleted']) - out['snapshots'] - out['blobs']} other items: "
          f"{human_bytes(out['reclaimed_bytes'])} reclaimed")
    return 0


def all_revisions(filter_text: str | None = None) -> list[dict[str, Any]]:
    """``ls --all-revisions``: one row per cached snapshot, the canonical one marked."""
    from pathlib import Path

    import huggingface_hub as hf

    from ..library import partial
    from ..library.scan import _canonical
    from ..models.paths import hf_cache_dir

    cache = hf_cache_dir()
    if not cache.is_dir():
        return []
    rows = []
    for repo in sorted(hf.scan_cache_dir(cache).repos, key=lambda r: r.repo_id.lower()):
        if repo.repo_type != "model" or (filter_text and filter_text.lower()
                                         not in repo.repo_id.lower()):
            continue
        canonical = _canonical(repo)
        for rev in sorted(repo.revisions, key=lambda r: -r.last_modified):
            rows.append({"repo_id": repo.repo_id, "revision": rev.commit_hash,
                         "refs": sorted(rev.refs), "size_bytes": rev.size_on_disk,
                         "canonical": rev is canonical,
                         "partial": partial.incomplete(Path(rev.snapshot_path))})
    return rows


def print_revisions(rows: list[dict[str, Any]]) -> None:
    from ..library.report import human_bytes

    for r in rows:
        mark = "*" if r["canonical"] else "!" if r["partial"] else " "
        refs = ",".join(r["refs"]) or "-"
        print(f"{mark} {r['repo_id']:<48} {r['revision'][:12]}  {refs:<12} "
              f"{human_bytes(r['size_bytes']):>9}{'  (partial)' if r['partial'] else ''}")
