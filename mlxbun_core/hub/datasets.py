"""Dataset builders: templates that turn what a user has into an mlx-lm training set.

The output is a folder ``<home>/datasets/dataset-<template>-<timestamp>`` holding
``train.jsonl`` and ``valid.jsonl`` in one of mlx-lm's row formats (``messages``,
``prompt``/``completion``, ``text``), which ``mlxbun train --data`` and
``/api/finetune/submit`` take as they are. Templates:

- ``chat-sessions``: saved web-chat sessions, each one's active branch as a
  ``messages`` row (roles user/assistant/system, text only; answers the user stopped
  midway are dropped);
- ``jsonl-import``: a local JSONL file whose rows are already in one of those
  formats, checked row by row (a bad row is counted and skipped) and split.

Builds run as jobs (``kind: "dataset"``); the split is seeded, so the same input and
seed give the same sets.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import fspaths
from ..errors import BadRequest
from ..jobs.events import Emit, JobError
from ..models.paths import mlxbun_home

MAX_ROWS = 200_000
MAX_ROW_BYTES = 1 << 20
_COMMON = [{"name": "valid_fraction", "type": "number", "label": "Validation share",
            "hint": "0 to 0.5 of the rows go to valid.jsonl", "default": 0.1},
           {"name": "seed", "type": "number", "label": "Shuffle seed", "default": 0}]

TEMPLATES: list[dict[str, Any]] = [
    {"id": "chat-sessions", "label": "Chat sessions",
     "description": "Your saved web-chat conversations as chat-format training rows.",
     "output_format": "messages", "needs_llm": False,
     "fields": [{"name": "sessions", "type": "textarea", "label": "Sessions",
                 "hint": "session file names, one per line (empty: every saved session)"},
                *_COMMON]},
    {"id": "jsonl-import", "label": "Import JSONL",
     "description": "A local JSONL file of messages, prompt/completion or text rows, "
                    "checked and split into train and valid.",
     "output_format": "messages", "needs_llm": False,
     "fields": [{"name": "path", "type": "text", "label": "JSONL file", "required": True},
                *_COMMON]},
]


def templates() -> dict[str, Any]:
    return {"ok": True, "templates": TEMPLATES}


def prepare(body: dict[str, Any], home: Path | None = None,
            sessions: Path | None = None) -> dict[str, Any]:
    """The job's config from ``{template_id, inputs}``; 400 for what is wrong now."""
    tid = body.get("template_id")
    if not any(t["id"] == tid for t in TEMPLATES):
        raise BadRequest(f"unknown template {tid!r}", param="template_id")
    inputs = body.get("inputs") or {}
    if not isinstance(inputs, dict):
        raise BadRequest("inputs must be an object", param="inputs")
    try:
        frac = float(inputs.get("valid_fraction", 0.1))
        seed = int(inputs.get("seed", 0) or 0)
    except (TypeError, ValueError):
        raise BadRequest("valid_fraction and seed must be numbers", param="inputs") from None
    if not 0 <= frac <= 0.5:
        raise BadRequest("valid_fraction must be between 0 and 0.5", param="valid_fraction")
    out = mlxbun_home(home) / "datasets" / f"dataset-{tid}-{time.strftime('%Y%m%d-%H%M%S')}"
    config: dict[str, Any] = {"template_id": tid, "valid_fraction": frac, "seed": seed,
                              "output_dir": str(out)}
    if tid == "jsonl-import":
        config["path"] = str(fspaths.resolve(inputs.get("path"), "path"))
        if not Path(config["path"]).is_file():
            raise BadRequest(f"path {config['path']} is not a file", param="path")
    else:
        from ..webchat.store import sessions_dir

        root = Path(sessions) if sessions is not None else sessions_dir()
        names = [n.strip() for n in str(inputs.get("sessions") or "").splitlines() if n.strip()]
        files = sorted(root.glob("*.jsonl")) if not names else [root / Path(n).name
                                                                 for n in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise BadRequest(f"no such session: {', '.join(missing[:5])}", param="sessions")
        if not files:
            raise BadRequest("there are no saved chat sessions yet", param="sessions")
        config["sessions"] = [str(f) for f in files]
    return config


def _session_rows(files: list[str]) -> Iterator[dict[str, Any]]:
    from ..webchat.store import Session, message_text, read_entries

    for name in files:
        session = Session(None, Path(name), read_entries(Path(name)))  # read-only replay: no store
        messages = []
        system = session.settings.get("systemPrompt") or session.settings.get("system")
        if isinstance(system, str) and system.strip():
            messages.append({"role": "system", "content": system})
        for entry in session.branch():
            msg = entry["message"]
            if (entry.get("meta") or {}).get("finish") == "interrupted":
                break
            text = message_text(msg)
            if msg.get("role") in ("user", "assistant") and text.strip():
                messages.append({"role": msg["role"], "content": text})
        while messages and messages[-1]["role"] != "assistant":
            messages.pop()
        if any(m["role"] == "user" for m in messages):
            yield {"messages": messages}


def _valid_row(row: object) -> bool:
    if not isinstance(row, dict):
        return False
    if isinstance(row.get("messages"), list):
        return all(isinstance(m, dict) and isinstance(m.get("role"), str)
                   and isinstance(m.get("content"), str) for m in row["messages"]) and bool(
            row["messages"])
    if "prompt" in row or "completion" in row:
        return isinstance(row.get("prompt"), str) and isinstance(row.get("completion"), str)
    return isinstance(row.get("text"), str) and bool(row["text"])


def _jsonl_rows(path: str, counts: dict[str, int]) -> Iterator[dict[str, Any]]:
    with open(path, "rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            try:
                row = json.loads(raw) if len(raw) <= MAX_ROW_BYTES else None
            except (ValueError, UnicodeDecodeError):
                row = None
            if _valid_row(row):
                yield row  # type: ignore[misc]  # _valid_row checked it is a dict
            else:
                counts["skipped"] += 1


def run(config: dict[str, Any], emit: Emit) -> dict[str, Any]:
    counts = {"skipped": 0}
    emit({"type": "stage", "stage": "read", "progress": 0.1, "message": config["template_id"]})
    if config["template_id"] == "jsonl-import":
        source = _jsonl_rows(config["path"], counts)
    else:
        source = _session_rows(config["sessions"])
    rows = []
    for row in source:
        rows.append(row)
        if len(rows) >= MAX_ROWS:
            break
    if not rows:
        raise JobError(f"no usable rows ({counts['skipped']} skipped): nothing to train on")
    random.Random(config["seed"]).shuffle(rows)
    n_valid = int(round(len(rows) * config["valid_fraction"]))
    if config["valid_fraction"] > 0 and len(rows) > 1:
        n_valid = max(1, n_valid)
    out = Path(config["output_dir"])
    out.mkdir(parents=True, exist_ok=False)
    emit({"type": "stage", "stage": "write", "progress": 0.8, "message": str(out)})
    for name, part in (("valid", rows[:n_valid]), ("train", rows[n_valid:])):
        with open(out / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for row in part:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return {"output_dir": str(out), "n_train": len(rows) - n_valid, "n_valid": n_valid,
            "skipped": counts["skipped"]}
