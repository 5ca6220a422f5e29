"""Push a folder to the hub as a job (``kind: "push"``), with a generated card.

A quantized model, an adapter or a dataset goes up with ``huggingface_hub``'s
``create_repo`` + ``upload_folder``; when the folder has no ``README.md`` a model
(or dataset) card is written from what the folder says about itself (base model,
quantization, adapter method, row counts) and uploaded with it. The token is the
saved one (Settings, ``hf auth login``) or ``HF_TOKEN``; without one the request
fails before any work starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import fspaths
from ..errors import BadRequest
from ..jobs.events import Emit, JobError
from . import remote

KINDS = {"quantize": "model", "finetune": "model", "dataset": "dataset", "model": "model"}
IGNORE = [".git/*", "__pycache__/*", "*.tmp", ".cache/*"]


def prepare(body: dict[str, Any], kind: str, job_output: str | None) -> dict[str, Any]:
    """The job's config: ``repo_id``, the source folder, private flag, repo type."""
    repo_id = remote.check_repo_id(body.get("repo_id"), "repo_id")
    source = body.get("source_path") or job_output
    if not source:
        raise BadRequest("no source directory: pass source_path, or a job_id whose job "
                         "has an output", param="source_path")
    path = fspaths.existing_dir(source, "source_path")
    if not any(path.iterdir()):
        raise BadRequest(f"source_path {path} is empty", param="source_path")
    if remote.token() is None:
        raise BadRequest("no hub token saved: add a write token in Settings (or "
                         "`hf auth login`, or HF_TOKEN) first", param="token")
    return {"repo_id": repo_id, "source_path": str(path), "private": bool(body.get("private")),
            "repo_type": KINDS[kind], "kind": kind}


def card(path: Path, repo_id: str, repo_type: str) -> str:
    """A short README for a folder without one, from its own metadata files."""
    cfg = _json(path / "config.json")
    adapter = _json(path / "adapter_config.json")
    lines = ["---", *(["library_name: mlx"] if repo_type == "model" else []), "tags:", "- mlx",
             "- mlxbun"]
    base = adapter.get("base_model_name_or_path") or adapter.get("model") or cfg.get(
        "_name_or_path")
    if base and repo_type == "model":
        lines.append(f"base_model: {base}")
    lines += ["---", "", f"# {repo_id.split('/')[-1]}", ""]
    if repo_type == "dataset":
        counts = {f.stem: sum(1 for _ in f.open()) for f in sorted(path.glob("*.jsonl"))}
        lines.append("A training set in mlx-lm's JSONL format, built with mlxbun.")
        lines += [""] + [f"- `{k}.jsonl`: {n} rows" for k, n in counts.items()]
    elif adapter:
        lines.append(f"A LoRA adapter ({adapter.get('fine_tune_type', 'lora')}) made with "
                     f"mlxbun{f' for {base}' if base else ''}.")
    else:
        q = cfg.get("quantization") or {}
        what = f"{q.get('bits')}-bit (group {q.get('group_size')})" if q else "MLX"
        lines.append(f"An {what} MLX checkpoint made with mlxbun"
                     f"{f' from {base}' if base else ''}.")
        lines += ["", "```sh", f"mlxbun serve {repo_id}", "```"]
    return "\n".join(lines) + "\n"


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def upload(config: dict[str, Any], emit: Emit | None = None) -> str:
    """Create the repo (if needed) and upload the folder; returns the repo URL."""
    from huggingface_hub import CommitOperationAdd

    api = remote.api()
    path, repo_id, repo_type = Path(config["source_path"]), config["repo_id"], config["repo_type"]
    say = emit or (lambda event: None)
    try:
        say({"type": "stage", "stage": "create", "progress": 0.05, "message": repo_id})
        url = api.create_repo(repo_id, repo_type=repo_type, private=config["private"],
                              exist_ok=True)
        say({"type": "stage", "stage": "upload", "progress": 0.1,
             "message": f"uploading {path}"})
        api.upload_folder(repo_id=repo_id, folder_path=str(path), repo_type=repo_type,
                          ignore_patterns=IGNORE, commit_message="Upload with mlxbun")
        if not (path / "README.md").exists():
            say({"type": "stage", "stage": "card", "progress": 0.9, "message": "model card"})
            text = card(path, repo_id, repo_type).encode()
            api.create_commit(repo_id=repo_id, repo_type=repo_type, commit_message="Add card",
                              operations=[CommitOperationAdd("README.md", text)])
    except Exception as exc:
        raise JobError(remote.explain(exc, repo_id)) from None
    return str(url)


def run(config: dict[str, Any], emit: Emit) -> dict[str, Any]:
    url = upload(config, emit)
    return {"output_dir": config["source_path"], "url": url, "repo_id": config["repo_id"]}
