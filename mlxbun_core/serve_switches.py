"""``serve`` flags spelled as the reference and mlx_lm.server spell them: aliases folded
into ours (``--temp``, ``--decode-concurrency``), ``--thinking``, and the reference's
decode-route switches, each applied where MLX allows it on this backend and refused at
start with the reason where it would do nothing (a switch is never silently ignored)."""

from __future__ import annotations

import argparse

from .config.runtime import start_refusals
from .env_readers import parse_thinking
from .request_fields import BY_NAME

# the reference's tier presets and decode-route switches; None: not typed
ROUTE_DESTS = ("compiled_decode", "compiled_activations", "fused_sdpa", "force_wire",
               "l1", "l2", "l3")
# dest of an mlx_lm.server spelling -> our dest (a typed flag of ours wins)
ALIASES = {"temp": ("temperature", "--temp"), "decode_concurrency": ("batch",
                                                                     "--decode-concurrency")}


def _thinking(text: str) -> bool | None:
    try:
        return parse_thinking(text, "--thinking")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--thinking ")) from None


def _temperature(text: str) -> float:
    value = float(text)
    said = BY_NAME["temperature"].out_of_range(value, "value")
    if said is not None:
        raise argparse.ArgumentTypeError(said.removeprefix("value "))
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def add_spelling_flags(s: argparse.ArgumentParser) -> None:
    """mlx_lm.server's spellings of two of ours, and the server's thinking default."""
    s.add_argument("--temp", dest="temp", type=_temperature,
                   default=None, metavar="N",
                   help="mlx_lm.server's spelling of --temperature (a typed --temperature "
                        "wins)")
    s.add_argument("--decode-concurrency", dest="decode_concurrency", type=_positive_int,
                   default=None, metavar="N",
                   help="mlx_lm.server's spelling of --batch (a typed --batch wins)")
    s.add_argument("--thinking", type=_thinking, default=None, metavar="true|false",
                   help="the chat template's enable_thinking when a request sets neither it "
                        "nor reasoning_effort (default: the model's own; MLXBUN_THINKING)")


def add_route_flags(s: argparse.ArgumentParser) -> None:
    """The reference's decode-route switches (docs/spec-rows.md says what each does here)."""
    s.add_argument("--compiled-activations", choices=("on", "off"), default=None,
                   help="off: run without mx.compile (mlx-lm's compiled activations and "
                        "sampler pieces as plain ops), an A/B lever; on is the default")
    s.add_argument("--force-wire", action="store_const", const=True, default=None,
                   help="Metal only: wire the model's memory for the whole run "
                        "(mx.set_wired_limit to the device's recommended working set)")
    for flag in ("--compiled-decode", "--fused-sdpa"):
        s.add_argument(flag, choices=("on", "off"), default=None, help=argparse.SUPPRESS)
    for flag in ("--l1", "--l2", "--l3"):
        s.add_argument(flag, action="store_const", const=True, default=None,
                       help=argparse.SUPPRESS)


def fold_aliases(args: argparse.Namespace, sources: dict[str, str]) -> None:
    """``--temp`` into ``temperature`` and ``--decode-concurrency`` into ``batch``, unless
    our own flag was typed too; they win over the environment and the file like any flag."""
    for alias, (dest, flag) in ALIASES.items():
        value = getattr(args, alias, None)
        if value is not None and sources.get(dest) != "flag":
            setattr(args, dest, value)
            sources[dest] = f"flag {flag}"


def backend() -> str:
    """``metal``, ``cuda`` or ``cpu``: where MLX runs by default."""
    from .backend import backend as where

    return where()


def _route_refusals(args: argparse.Namespace, where: str) -> list[str]:
    said = {d: getattr(args, d, None) for d in ROUTE_DESTS}
    out = []
    if said["compiled_decode"] is not None:
        out.append("--compiled-decode is refused: the batch's decode step runs over paged KV "
                   "whose block tables and lengths change every step, so mx.compile would "
                   "trace it anew each step; mlx-lm's samplers are compiled already")
    if said["fused_sdpa"] is not None:
        out.append("--fused-sdpa is refused: MLX has no fused attention over quantized KV; "
                   "--kv-quant attends through mlx-lm's quantized attention, the one path")
    if said["compiled_activations"] == "on":
        out.append("--compiled-activations on is refused: it is how mlx-lm's models always "
                   "run; only 'off' changes anything")
    if said["force_wire"] and where != "metal":
        out.append(f"--force-wire is refused: wired memory is a Metal setting (Apple's "
                   f"unified memory); on {where} MLX has nothing to wire")
    if said["l1"]:
        out.append("--l1 is refused: it names the default route (greedy output equals "
                   "mlx-lm's generate_step), so it would do nothing")
    if said["l2"]:
        out.append("--l2 is refused: it promises mlx-optiq's output bit for bit (its fused "
                   "SDPA, its quantized sliding-window caches), which this engine does not "
                   "have; --kv-quant config gives the per-layer kv_config.json KV itself")
    if said["l3"]:
        out.append("--l3 is refused: the reference removed it")
    return out


def refusals(args: argparse.Namespace) -> list[str]:
    """Why ``args`` and the environment cannot start (empty: they can)."""
    where = backend() if getattr(args, "force_wire", None) else "any"
    return [*_route_refusals(args, where), *start_refusals()]


def apply_switches(args: argparse.Namespace) -> list[str]:
    """Apply the route switches that do something here (before the model loads); returns
    what was applied, for the banner's log."""
    import mlx.core as mx

    done = []
    if getattr(args, "compiled_activations", None) == "off":
        mx.disable_compile()
        done.append("compile off (--compiled-activations off)")
    if getattr(args, "force_wire", None):
        limit = int(mx.metal.device_info()["max_recommended_working_set_size"])
        mx.set_wired_limit(limit)
        done.append(f"wired limit {limit / 1e9:.1f} GB (--force-wire)")
    return done
