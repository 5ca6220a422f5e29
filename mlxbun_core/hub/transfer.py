"""One file of a hub repo into the HF cache, resumable across processes, verified.

``huggingface_hub`` (2.x) downloads into a uniquely named temporary file that it
deletes on failure, in 10 MiB reads: a cancelled or crashed download starts over, and
progress moves in 10 MiB steps. Here the partial blob keeps a stable name,
``blobs/<etag>.incomplete``, so the next attempt resumes it with a Range request, and
bytes are written (and counted) a MiB at a time, over ``huggingface_hub``'s own HTTP
session (its headers, proxies and error mapping). A whole blob is checked against its
etag (sha256 for LFS files, the git blob id for small ones) before it is renamed into
place and linked from the snapshot, exactly where ``huggingface_hub`` itself puts it.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

from ..jobs.events import JobError
from . import remote


def _digest(path: Path, etag: str) -> str | None:
    """The content's id in the etag's kind (None: an etag we cannot check)."""
    if len(etag) == 64:
        h = hashlib.sha256()
    elif len(etag) == 40:
        h = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    else:
        return None
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(repo: str, name: str, commit: str, repo_dir: Path, bar: type) -> Path:
    """Download ``name`` at ``commit`` (resuming a partial blob); returns the snapshot link."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    from ..models import hub_timeout

    hub_timeout.install()
    token = remote.token() or False
    url = hf_hub_url(repo, name, revision=commit, endpoint=remote.endpoint())
    meta = get_hf_file_metadata(url, token=token, endpoint=remote.endpoint(),
                                timeout=hub_timeout.seconds())
    if not meta.etag:
        raise JobError(f"the hub gave no etag for {name}: cannot verify it")
    blobs = repo_dir / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    blob = blobs / meta.etag
    if not blob.exists():
        part = blobs / f"{meta.etag}.incomplete"
        have = part.stat().st_size if part.exists() else 0
        if meta.size is not None and have > meta.size:  # not a prefix of this file
            part.unlink()
            have = 0
        _get(meta.location, part, meta.size, build_hf_headers(token=token), bar)
        got = _digest(part, meta.etag)
        if got is not None and got != meta.etag:
            part.unlink()
            raise JobError(f"{name} failed verification (content {got[:12]}…, the hub says "
                           f"{meta.etag[:12]}…); it was removed, download again")
        os.replace(part, blob)
    else:
        bar(initial=blob.stat().st_size)  # already here: counts as received
    link = repo_dir / "snapshots" / commit / name
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(os.path.relpath(blob, link.parent), link)
    return link


READ_BYTES = 1 << 20
ATTEMPTS = 4


def _get(url: str, part: Path, size: int | None, headers: dict[str, Any], bar: type) -> None:
    """Append the rest of ``url`` to ``part`` (Range from its size), retrying a dropped
    connection from where it stopped."""
    from huggingface_hub.utils import get_session, hf_raise_for_status

    for attempt in range(ATTEMPTS):
        have = part.stat().st_size if part.exists() else 0
        if size is not None and have >= size:
            return
        ask = {**headers, "Accept-Encoding": "identity"}
        if have:
            ask["Range"] = f"bytes={have}-"
        try:
            with get_session().stream("GET", url, headers=ask, follow_redirects=True) as r:
                if r.status_code >= 400:
                    r.read()
                    hf_raise_for_status(r)
                resumed = have > 0 and r.status_code == 206
                counter = bar(initial=have if resumed else 0, total=size)
                with open(part, "ab" if resumed else "wb") as f:
                    for chunk in r.iter_bytes(READ_BYTES):
                        f.write(chunk)
                        counter.update(len(chunk))
        except Exception as exc:
            if attempt + 1 == ATTEMPTS or not remote.is_network(exc):
                raise
            time.sleep(1.0)
            continue
        got = part.stat().st_size
        if size is None or got == size:
            return
        if got > size:
            part.unlink()
            raise JobError(f"the hub sent {got} bytes of {url}, more than the {size} it "
                           "announced; the partial file was removed")
    raise JobError(f"{url}: the connection kept dropping ({ATTEMPTS} attempts); "
                   "download again to resume")
