"""What ``/v1/models`` adds to the model rows: each row's ``state`` (``resident``,
``loading``, ``on_disk``, ``downloading``), rows for models being downloaded, and the
config file's aliases (``"alias_of"``), both in-process and on the ``--isolate`` parent."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .downloads import downloading

Row = dict[str, Any]


def with_states(rows: list[Row], aliases: dict[str, str], created: int,
                describe: Callable[[str], dict[str, Any]] | None = None,
                allowed: Callable[[str], bool] | None = None,
                expected: Iterable[str] = ()) -> list[Row]:
    """``rows`` with a ``state`` each (``describe(id)``'s fields, else resident for the
    first row and on disk for the others), then download rows, then alias rows; with
    ``allowed``, only the models (and aliases) it admits; ``expected`` models that are
    neither (an allow-list's model not downloaded yet) get a ``missing`` row."""
    live = downloading()
    out = []
    for i, row in enumerate(rows):
        if allowed is not None and not allowed(row["id"]):
            continue
        live_fields = describe(row["id"]) if describe else {
            "state": "resident" if i == 0 else "on_disk"}
        out.append({**row, **live_fields})
    known = {r["id"] for r in out}
    for model_id, progress in live.items():
        if model_id in known or (allowed is not None and not allowed(model_id)):
            continue
        out.append({"id": model_id, "object": "model", "created": created,
                    "owned_by": "mlxbun", "state": "downloading", "download": progress})
        known.add(model_id)
    for model_id in expected:
        if model_id not in known:
            out.append({"id": model_id, "object": "model", "created": created,
                        "owned_by": "mlxbun", "state": "missing"})
            known.add(model_id)
    out += alias_rows(aliases, out, created, allowed)
    return out


def alias_rows(aliases: dict[str, str], rows: Iterable[Row], created: int,
               allowed: Callable[[str], bool] | None = None) -> list[Row]:
    """One row per alias whose target is listed (or may be downloaded): its target's
    fields under the alias's id, with ``alias_of``."""
    by_id = {r["id"]: r for r in rows}
    out = []
    for name, target in aliases.items():
        if name in by_id or (allowed is not None and not allowed(name)):
            continue
        base = by_id.get(target)
        row = {**base} if base else {"object": "model", "created": created,
                                     "owned_by": "mlxbun", "state": "missing"}
        out.append({**row, "id": name, "alias_of": target})
    return out
