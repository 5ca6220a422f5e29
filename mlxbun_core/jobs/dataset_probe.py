"""Look at a training set before a job trains on it, and take one from the browser.

:func:`inspect` reads a dataset folder (``train.jsonl``, optional ``valid.jsonl`` and
``test.jsonl``) or one JSONL file and says what the trainer would see: rows per split,
the row format and the fields found, a few samples, token counts with the model's own
tokenizer when one is given, and every problem with its file and line (bad JSON, a row
in no format mlx-lm reads, a format that differs from the first row's, a row longer than
``max_seq_length`` tokens). Nothing is changed. :func:`save_upload` writes JSONL text the
web page read from a file into ``<home>/datasets/upload-<name>-<time>/``, split into
train and valid when no valid part came with it.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import fspaths
from ..errors import BadRequest
from .finetune import format_of

SPLITS = ("train", "valid", "test")
MAX_ROWS = 200_000          # rows read per split; the rest are counted as not inspected
MAX_ROW_BYTES = 1 << 20
MAX_PROBLEMS = 50
MAX_SAMPLES = 5
SAMPLE_CHARS = 400
MAX_UPLOAD_BYTES = 24 << 20
Counter_ = Callable[[dict[str, Any], str], int]


def inspect(path: Any, count_tokens: Counter_ | None = None,
            max_seq_length: int | None = None, samples: int = 3) -> dict[str, Any]:
    """What a dataset holds and what is wrong with it (``ok`` false when training on it
    would fail: no train rows, or rows in no format mlx-lm reads)."""
    where = fspaths.resolve(path, "path")
    if where.is_dir():
        files = {s: where / f"{s}.jsonl" for s in SPLITS if (where / f"{s}.jsonl").is_file()}
        if "train" not in files:
            return {"ok": False, "path": str(where), "splits": {}, "problems": [],
                    "error": f"{where / 'train.jsonl'} not found"}
    elif where.is_file():
        files = {"train": where}
    else:
        raise BadRequest(f"path: {where} is neither a folder nor a file", param="path")
    report = _Report(count_tokens, max_seq_length, max(0, min(samples, MAX_SAMPLES)))
    for split, file in files.items():
        report.read(split, file)
    return report.result(where)


class _Report:
    def __init__(self, count_tokens: Counter_ | None, max_len: int | None, samples: int):
        self.count_tokens, self.max_len, self.want = count_tokens, max_len, samples
        self.splits: dict[str, dict[str, Any]] = {}
        self.problems: list[dict[str, Any]] = []
        self.n_problems = 0
        self.fields: Counter[str] = Counter()
        self.formats: Counter[str] = Counter()
        self.samples: list[dict[str, Any]] = []
        self.tokens: list[int] = []
        self.first_format: str | None = None

    def problem(self, split: str, line: int, message: str) -> None:
        self.n_problems += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append({"split": split, "line": line, "message": message})

    def read(self, split: str, file: Path) -> None:
        rows = bad = 0
        with open(file, "rb") as f:
            for line_no, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                if rows + bad >= MAX_ROWS:
                    self.problem(split, line_no, f"only the first {MAX_ROWS} rows were inspected")
                    break
                if self.row(split, line_no, raw):
                    rows += 1
                else:
                    bad += 1
        self.splits[split] = {"rows": rows, "bad_rows": bad, "file": str(file)}

    def row(self, split: str, line: int, raw: bytes) -> bool:
        if len(raw) > MAX_ROW_BYTES:
            self.problem(split, line, f"the row is over {MAX_ROW_BYTES >> 20} MiB")
            return False
        try:
            row = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            self.problem(split, line, f"not valid JSON ({str(exc)[:80]})")
            return False
        fmt = format_of(row)
        why = _shape_problem(row, fmt)
        if why:
            self.problem(split, line, why)
            return False
        self.first_format = self.first_format or fmt
        if fmt != self.first_format:
            self.problem(split, line, f"a {fmt} row among {self.first_format} rows")
        self.formats[fmt] += 1
        self.fields.update(row.keys())
        if split == "train" and len(self.samples) < self.want:
            self.samples.append({"line": line, "row": _clipped(row)})
        if self.count_tokens is not None:
            n = self.count_tokens(row, fmt)
            self.tokens.append(n)
            if self.max_len and n > self.max_len:
                self.problem(split, line, f"{n} tokens: longer than max_seq_length "
                             f"{self.max_len} (the trainer cuts it)")
        return True

    def result(self, where: Path) -> dict[str, Any]:
        n_train = self.splits.get("train", {}).get("rows", 0)
        fmt = self.formats.most_common(1)[0][0] if self.formats else "unknown"
        error = None
        if not n_train:
            error = "train.jsonl has no usable rows"
        elif fmt == "dpo":
            error = "preference (dpo) rows: the trainer here does SFT only"
        if "valid" not in self.splits and error is None:
            self.problem("valid", 0, "no valid.jsonl: training runs without a validation loss")
        out: dict[str, Any] = {
            "ok": error is None, "path": str(where), "format": fmt,
            "n_train": n_train, "n_valid": self.splits.get("valid", {}).get("rows", 0),
            "splits": self.splits, "fields": dict(self.fields.most_common()),
            "samples": self.samples, "problems": self.problems,
            "problem_count": self.n_problems, "tokens": _token_stats(self.tokens)}
        return {**out, "error": error} if error else out


def _shape_problem(row: Any, fmt: str) -> str | None:
    if not isinstance(row, dict):
        return "the row is not a JSON object"
    if fmt == "unknown":
        return f"no known format (fields: {', '.join(list(row)[:6]) or 'none'}); " \
               "use messages, prompt/completion or text"
    if fmt == "messages":
        msgs = row["messages"]
        if not isinstance(msgs, list) or not msgs:
            return "messages must be a non-empty list"
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(
                    m.get("content"), str):
                return f"messages[{i}] needs a role and a text content"
    elif fmt == "prompt-completion":
        if not isinstance(row["prompt"], str) or not isinstance(row["completion"], str):
            return "prompt and completion must be text"
    elif fmt == "text" and (not isinstance(row["text"], str) or not row["text"].strip()):
        return "text must be non-empty text"
    return None


def _clipped(value: Any) -> Any:
    """A sample small enough to show: long strings cut."""
    if isinstance(value, str):
        return value if len(value) <= SAMPLE_CHARS else value[:SAMPLE_CHARS] + "…"
    if isinstance(value, list):
        return [_clipped(v) for v in value[:20]]
    if isinstance(value, dict):
        return {k: _clipped(v) for k, v in list(value.items())[:20]}
    return value


def _token_stats(tokens: list[int]) -> dict[str, Any] | None:
    if not tokens:
        return None
    return {"rows": len(tokens), "total": sum(tokens), "min": min(tokens), "max": max(tokens),
            "mean": round(sum(tokens) / len(tokens), 1)}


def token_counter(tokenizer: Any) -> Counter_:
    """Tokens of one row as the trainer builds it: the chat template for messages, else
    the text (prompt and completion joined)."""
    def count(row: dict[str, Any], fmt: str) -> int:
        if fmt == "messages":
            try:
                ids = tokenizer.apply_chat_template(row["messages"], tokenize=True)
                return len(ids)
            except Exception:  # no chat template: the plain text is the best guess
                text = "\n".join(m["content"] for m in row["messages"])
        elif fmt == "prompt-completion":
            text = row["prompt"] + row["completion"]
        else:
            text = row.get("text", "")
        return len(tokenizer.encode(text))

    return count


# -- a dataset from the browser ------------------------------------------------------------
def save_upload(body: dict[str, Any], home: Path) -> dict[str, Any]:
    """``{name, train, valid?, valid_fraction?}`` (JSONL text) → a dataset folder."""
    train, valid = body.get("train"), body.get("valid")
    if not isinstance(train, str) or not train.strip():
        raise BadRequest("train must be the JSONL text of the dataset", param="train")
    if valid is not None and not isinstance(valid, str):
        raise BadRequest("valid must be JSONL text", param="valid")
    if len(train.encode()) + len((valid or "").encode()) > MAX_UPLOAD_BYTES:
        raise BadRequest(f"the dataset is over {MAX_UPLOAD_BYTES >> 20} MiB: "
                         "put it in a folder and inspect that path instead", param="train")
    try:
        frac = float(body.get("valid_fraction", 0.1))
    except (TypeError, ValueError):
        raise BadRequest("valid_fraction must be a number", param="valid_fraction") from None
    if not 0 <= frac <= 0.5:
        raise BadRequest("valid_fraction must be between 0 and 0.5", param="valid_fraction")
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", str(body.get("name") or "dataset"))
    name = re.sub(r"\.jsonl?$", "", name).strip("-.")[:60] or "dataset"
    out = home / "datasets" / f"upload-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    out = fspaths.output_dir(out, "name")
    lines = [ln for ln in train.splitlines() if ln.strip()]
    if valid is None and frac > 0 and len(lines) > 1:
        order = list(range(len(lines)))
        random.Random(0).shuffle(order)
        n_valid = max(1, round(len(lines) * frac))
        held = set(order[:n_valid])
        valid = "".join(lines[i] + "\n" for i in sorted(held))
        train = "".join(ln + "\n" for i, ln in enumerate(lines) if i not in held)
    out.mkdir(parents=True, exist_ok=False)
    (out / "train.jsonl").write_text(train if train.endswith("\n") else train + "\n",
                                     encoding="utf-8")
    if valid:
        (out / "valid.jsonl").write_text(valid if valid.endswith("\n") else valid + "\n",
                                         encoding="utf-8")
    return {"ok": True, "path": str(out), "name": out.name}


def local_datasets(home: Path, limit: int = 100) -> list[dict[str, Any]]:
    """Dataset folders under ``<home>/datasets`` (built, uploaded), newest first."""
    root = home / "datasets"
    if not root.is_dir():
        return []
    found = [d for d in root.iterdir() if d.is_dir() and (d / "train.jsonl").is_file()]
    found.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    rows = []
    for d in found[:limit]:
        size = sum(f.stat().st_size for f in d.glob("*.jsonl"))
        rows.append({"name": d.name, "path": str(d), "size_bytes": size,
                     "has_valid": (d / "valid.jsonl").is_file(),
                     "modified": int(d.stat().st_mtime)})
    return rows
