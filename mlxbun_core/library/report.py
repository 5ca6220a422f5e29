"""Fit reports and library rows in the shapes ``/fit``, ``/library`` and the CLI print.

All numbers come from :mod:`.fit` with the checkpoint's config and header-read
weight bytes, so the server's admission, ``/fit`` and ``mlxbun fit`` agree.
"""

from __future__ import annotations

from ..kvquant import KVScheme
from . import checkpoint
from .fit import (
    DECODE_EFFICIENCY,
    KVBits,
    Machine,
    activation_dtype,
    plan,
    predicted_decode_tps,
)

TYPICAL_CONTEXT = 8192
SKU_CONTEXT = 32768
SKU_WIRED_SHARE = 0.75  # macOS lets the GPU wire about this share of RAM by default
# (sku, RAM GB, bandwidth GB/s) across the Apple silicon line-up
APPLE_SKUS = (
    ("M4 16 GB", 16, 120.0), ("M4 24 GB", 24, 120.0), ("M4 32 GB", 32, 120.0),
    ("M4 Pro 24 GB", 24, 273.0), ("M4 Pro 48 GB", 48, 273.0), ("M4 Pro 64 GB", 64, 273.0),
    ("M4 Max 36 GB", 36, 410.0), ("M4 Max 64 GB", 64, 546.0), ("M4 Max 128 GB", 128, 546.0),
    ("M3 Ultra 96 GB", 96, 819.0), ("M3 Ultra 256 GB", 256, 819.0),
    ("M3 Ultra 512 GB", 512, 819.0),
)


def fit_report(config: dict, weights: checkpoint.Weights, machine: Machine, *,
               context: int | None = None, budget_bytes: int | None = None,
               kv_bits: KVBits = None, weights_bytes: int | None = None,
               ceiling: int | None = None, skus: bool = True) -> dict:
    """``GET /fit``: the plan at ``context`` (default: the admission ceiling) on this machine.

    A serving engine passes what its admission uses: ``weights_bytes`` (the loaded
    parameters), ``budget_bytes`` and ``ceiling`` (the enforced context), so the two agree;
    otherwise the header-read weights and the machine's usable memory are used.
    ``kv_bits`` bills a quantized KV cache (``--kv-quant 4|8``).
    """
    budget = budget_bytes or machine.usable_bytes
    total = weights_bytes or weights.total_bytes
    best = plan(config, total, budget, kv_bits=kv_bits)
    at = context or ceiling or best.max_safe_context or best.context_window or TYPICAL_CONTEXT
    p = plan(config, total, budget, context=at, kv_bits=kv_bits)
    active = total - (weights.total_bytes - checkpoint.active_weight_bytes(config, weights))
    typical = min(TYPICAL_CONTEXT, at)
    report = {k: v for k, v in p.report().items() if k != "context_tokens"}
    report.update(active_weight_bytes=active, memory_budget_bytes=budget_bytes,
                  predicted_decode_tps=predicted_decode_tps(active, p.kv_bytes,
                                                            machine.bandwidth_gbs))
    out = {"machine": machine.describe(), "context_tokens": at,
           "kv_quant": "mixed (kv_config.json)" if isinstance(kv_bits, tuple) else
           KVScheme(kv_bits).mode(activation_dtype(config)),
           "typical_context_tokens": typical,
           "typical_decode_tps": predicted_decode_tps(active, p.kv.bytes_at(typical),
                                                      machine.bandwidth_gbs),
           "measured_decode_tps": None, "measured_at": None, "report": report}
    if skus:
        sku_ctx = context or SKU_CONTEXT  # an asked context, else 32k
        out["sku_matrix_ctx"] = sku_ctx
        out["sku_matrix"] = sku_matrix(config, weights, kv_bits, sku_ctx)
    return out


def sku_matrix(config: dict, weights: checkpoint.Weights, kv_bits: KVBits = None,
               context: int = SKU_CONTEXT) -> list[dict]:
    active = checkpoint.active_weight_bytes(config, weights)
    rows = []
    for sku, ram_gb, gbs in APPLE_SKUS:
        usable = int(ram_gb * (1 << 30) * SKU_WIRED_SHARE)
        p = plan(config, weights.total_bytes, usable, context=context, kv_bits=kv_bits)
        rows.append({"sku": sku, "ram_gb": ram_gb, "fits": p.fits,
                     "max_context": p.max_safe_context,
                     "decode_tps": predicted_decode_tps(active, p.kv_bytes, gbs,
                                                        DECODE_EFFICIENCY)})
    return rows


def sku_text(r: dict) -> str:
    """``fit --skus``: the Apple silicon lineup at the report's SKU context."""
    lines = [f"  Apple silicon at {r['sku_matrix_ctx']} tokens ({r['kv_quant']} KV):"]
    for row in r["sku_matrix"]:
        verdict = "fits" if row["fits"] else "does NOT fit"
        lines.append(f"    {row['sku']:<24} {row['ram_gb']:>4} GB  {verdict:<12} max "
                     f"{row['max_context']:>7} tokens  ~{row['decode_tps']} tok/s")
    return "\n".join(lines)


def assessment(entry, machine: Machine) -> dict | None:
    """The short fit a ``/library`` row carries (None when the config gives no shape)."""
    t = entry.config.get("text_config") or entry.config
    if not t.get("num_hidden_layers"):
        return None
    p = plan(entry.config, entry.weights.total_bytes, machine.usable_bytes)
    active = checkpoint.active_weight_bytes(entry.config, entry.weights)
    typical = min(TYPICAL_CONTEXT, p.max_safe_context) if p.max_safe_context else TYPICAL_CONTEXT
    return {"fits": p.max_safe_context > 0, "max_safe_context": p.max_safe_context,
            "kv_bytes_per_token": p.kv.bytes_per_token,
            "predicted_decode_tps": predicted_decode_tps(active, p.kv.bytes_at(typical),
                                                         machine.bandwidth_gbs)}


def library_row(entry, machine: Machine, served_id: str | None = None) -> dict:
    row = entry.row()
    row.pop("path", None)  # local paths stay off the wire
    row.update(serving=entry.id == served_id, assessment=assessment(entry, machine))
    return row


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def ls_table(entries, machine: Machine) -> str:
    """``mlxbun ls``: one line per local model."""
    head = ("MODEL", "TYPE", "TIER", "PLUGIN", "SIZE", "PRECISION", "CONTEXT", "FITS", "MAX CTX",
            "TOK/S", "CAPS")
    rows = [head]
    for e in entries:
        a = assessment(e, machine) or {}
        caps = ",".join(c for c in ("vision", "audio") if getattr(e, c)) or "-"
        rows.append((e.id, e.model_type or "?", e.tier or "unsupported",
                     e.claim.plugin if e.claim else "-", human_bytes(e.size_bytes),
                     e.precision or "-",
                     str(e.context_length or "-"), "yes" if a.get("fits") else "no",
                     str(a.get("max_safe_context", "-")), str(a.get("predicted_decode_tps", "-")),
                     caps))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def fit_text(model_id: str, r: dict) -> str:
    """``mlxbun fit``'s report in words: the plan, the prediction and what it assumed."""
    rep, m = r["report"], r["machine"]
    at = f"{rep['predicted_decode_tps']} tok/s at {r['context_tokens']} tokens"
    if r["typical_context_tokens"] != r["context_tokens"]:
        at += f", {r['typical_decode_tps']} tok/s at {r['typical_context_tokens']}"
    return (f"{model_id} on {m['chip']} ({m['device']}, {human_bytes(m['usable_bytes'])} usable)\n"
            f"  weights        {human_bytes(rep['weights_bytes'])}\n"
            f"  KV per token   {human_bytes(rep['kv_bytes_per_token'])} ({r['kv_quant']})\n"
            f"  at {r['context_tokens']} tokens: KV {human_bytes(rep['kv_bytes'])} + prefill "
            f"transient {human_bytes(rep['transient_bytes'])} = "
            f"total {human_bytes(rep['total_bytes'])}"
            f" of {human_bytes(rep['usable_bytes'])}: {'fits' if rep['fits'] else 'does NOT fit'}\n"
            f"  max safe context  {rep['max_safe_context']} tokens\n"
            f"  predicted decode  {at}\n"
            f"  assumes           every active weight and the live KV read once per token at "
            f"{m['bandwidth_gbs']} GB/s, {m.get('bandwidth_note') or m['bandwidth_source']} "
            "(MLXBUN_BANDWIDTH_GBS overrides)")
