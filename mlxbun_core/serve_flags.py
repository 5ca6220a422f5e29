"""``mlxbun serve``'s flags (and the few ``fit`` shares): what to serve and where, the
engine, the process, distributed ranks, the model pool, and their value parsers."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from .request_fields import RequestField, flag_fields
from .serve_switches import add_route_flags, add_spelling_flags


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _cap(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be a token count, or 0 for no cap")
    return value


def _gigabytes(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be a positive number of GB")
    return value


DEFAULT_MAX_TOKENS = 4096
"""The completion cap of a request that names none (``--max-tokens``; 0: none). Clients
such as aider send no ``max_tokens`` and expect the model to stop by itself; a small model
that loops instead would run to the end of its window (minutes on a CPU). 4,096 is the
output limit those clients' edit formats were tuned against (GPT-4 Turbo, Claude 3), enough
for a whole-file edit of a few hundred lines, and aider reports a cut reply (``length``)
rather than failing. A request's own ``max_tokens`` is never changed."""


_UNITS = {"": 10**9, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20,
          "gib": 1 << 30, "tib": 1 << 40}


class ByteSize(int):
    """A byte count that prints as ``<n>B``, so a flag handed on (``--isolate``'s engine
    child) parses back to the same bytes rather than as GB."""

    def __str__(self) -> str:
        return f"{int(self)}B"


def byte_size(text: str) -> ByteSize:
    """``2GiB``, ``512MB``, ``123B``, ``1.5`` (a bare number is GB, 10^9, like
    --memory-budget)."""
    raw = text.strip().lower().replace(" ", "")
    num = raw.rstrip("kmgtib")
    unit = raw[len(num):]
    try:
        value = float(num) * _UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 2GiB, 512MB)") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be positive")
    return ByteSize(value)


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    """``mlxbun serve``'s flags, in the order ``--help`` lists them (and the ``--isolate``
    parent passes them on): what to serve and where, the engine, then the process."""
    s = sub.add_parser("serve", help="serve a model over OpenAI/Anthropic-compatible HTTP")
    s.add_argument("positional", nargs="?", default=None, metavar="model",
                   help="local dir, .gguf file, Hugging Face repo id, or a query matching a local "
                        "model id (default: the embedded SmolLM2-135M-Instruct)")
    add_selection_flags(s)
    s.add_argument("--host", default=os.environ.get("MLXBUN_HOST") or "127.0.0.1",
                   help="address to listen on (default: %(default)s; env MLXBUN_HOST; "
                        "0.0.0.0 for every interface)")
    s.add_argument("--port", type=int, default=int(os.environ.get("MLXBUN_PORT") or "8080"),
                   help="TCP port (default: %(default)s; env MLXBUN_PORT)")
    s.add_argument("--max-tokens", type=_cap, default=DEFAULT_MAX_TOKENS, metavar="N",
                   help="completion cap for requests that name none (default: %(default)s; "
                        "0: until EOS or the context's end); a request's own wins")
    s.add_argument("--context-length", type=_positive_int, metavar="N",
                   default=os.environ.get("MLXBUN_CONTEXT_LENGTH") or None,
                   help="the window to serve, in tokens: below the model's trained window it "
                        "caps, above it stretches RoPE (YaRN, linear or llama3, as the "
                        "architecture supports; quality degrades with the stretch) "
                        "(default: the model's own; 32768 for the embedded SmolLM2; env "
                        "MLXBUN_CONTEXT_LENGTH)")
    add_sampling_flags(s)
    add_spelling_flags(s)
    add_hlg_flags(s)
    add_engine_flags(s)
    add_route_flags(s)
    add_process_flags(s)


def add_sampling_flags(s: argparse.ArgumentParser) -> None:
    """A flag per sampler default in :mod:`.request_fields` (a request's own value wins),
    checked as a request's value would be."""
    for f in flag_fields():
        s.add_argument(f.flag_name, type=_sampling_value(f), default=None, metavar="N",
                       help=f"default {f.name} for requests that send none")


def _sampling_value(f: RequestField) -> Callable[[str], float | int]:
    def parse(text: str) -> float | int:
        value = float(text) if f.kind == "number" else int(text)
        said = f.out_of_range(value, "value")
        if said is not None:
            raise argparse.ArgumentTypeError(said.removeprefix("value "))
        return value
    parse.__name__ = "float" if f.kind == "number" else "int"  # argparse's and config's words
    return parse


def _nats(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"expected nats from 0 to 100, got {text}")
    return value


def add_hlg_flags(s: argparse.ArgumentParser) -> None:
    """HLG tone-curve sampling as the server default (a request's ``hlg`` merges over it)."""
    s.add_argument("--hlg-sampling", choices=("on", "off"), default="off",
                   help="tone-curve sampling on the log-probs for every request "
                        "(default: %(default)s; the mid gain is 1/--temperature)")
    for flag, default, what in (("width", 4.0, "mid-region half-width"),
                                ("shoulder", 4.0, "highlight rolloff scale"),
                                ("toe", 6.0, "shadow rolloff scale"),
                                ("pivot-offset", 6.0, "pivot: nats below the top token")):
        s.add_argument(f"--hlg-{flag}", type=_nats, default=default, metavar="NATS",
                       help=f"HLG {what} (default: %(default)s)")


def add_engine_flags(s: argparse.ArgumentParser) -> None:
    """How the engine runs the model: embeddings, speculative decoding, batch, caches, memory."""
    s.add_argument("--embedding", action="store_true",
                   help="serve a plain checkpoint as an embedding model")
    s.add_argument("--draft-model", default=None,
                   help="a small model with the same vocabulary for speculative decoding")
    s.add_argument("--draft-kind", choices=["ngram", "mtp"], default=None,
                   help="ngram: prompt-lookup speculation, no draft model (drafts copied from the "
                        "request's own prompt and output); mtp: the checkpoint's own "
                        "multi-token-prediction head drafts (Qwen3.5 mtp.* weights); "
                        "requests may set draft_kind")
    s.add_argument("--num-draft-tokens", type=_positive_int, default=None,
                   help="draft tokens verified per target forward (default 3 with "
                        "--draft-model, 10 with --draft-kind ngram, the head's own (2) with "
                        "mtp)")
    s.add_argument("--mtp", choices=("on", "off"), default=None,
                   help="the checkpoint's own MTP head drafts by default (on: as --draft-kind "
                        "mtp; default: on for GLM-5.x checkpoints carrying their MTP layer); "
                        "off: no MTP head at all, requests asking for it get a 400")
    s.add_argument("--ngram-max", type=_positive_int, default=3,
                   help="longest trailing n-gram prompt lookup matches (--draft-kind ngram)")
    s.add_argument("--ngram-min", type=_positive_int, default=1,
                   help="shortest trailing n-gram prompt lookup matches (--draft-kind ngram)")
    batch_env = os.environ.get("MLXBUN_BATCH")
    s.add_argument("--batch", type=_positive_int,
                   default=int(batch_env) if batch_env else None,
                   help="rows decoded together by continuous batching (default: sized from the "
                        "device and the model's KV, 4..64; 1 pins serial)")
    s.add_argument("--prompt-cache", type=float, metavar="GB",
                   default=float(os.environ.get("MLXBUN_PROMPT_CACHE", "8")),
                   help="prefix KV cache size in GiB (default 8; 0 turns it off)")
    s.add_argument("--memory-budget", type=float, metavar="GB", default=None,
                   help="memory the model, its KV and prefill may use, in GB (10^9 bytes); "
                        "sets max_safe_context and row admission (default: what MLX reports)")
    s.add_argument("--kv-budget", type=_gigabytes, metavar="GB", default=None,
                   help="aggregate KV the running rows' worst cases (prompt + max_tokens) may "
                        "reserve, in GB (10^9 bytes): a joiner that would pass it waits, a "
                        "request over it alone is a 400 (default: off, memory alone bounds it)")
    s.add_argument("--memory-wait", type=float, metavar="SECONDS",
                   default=float(os.environ.get("MLXBUN_MEMORY_WAIT", "60")),
                   help="how long a request may wait for memory before it is answered 503 "
                        "with Retry-After (default 60; 0 waits for ever)")
    s.add_argument("--expert-budget", type=byte_size, metavar="SIZE",
                   default=os.environ.get("MLXBUN_EXPERT_BUDGET") or None,
                   help="MoE families that support it (glm52) keep routed experts on disk and "
                        "hold at most SIZE of them in memory (2GiB, 800MB; a bare number is "
                        "GB), for a model bigger than memory; MLXBUN_EXPERT_BUDGET")
    s.add_argument("--expert-offload", action="store_true",
                   default=os.environ.get("MLXBUN_EXPERT_OFFLOAD", "") not in ("", "0"),
                   help="stream a MoE model's routed experts from its checkpoint (GLM-5.x "
                        "and mlx-lm's SwitchGLU MoEs: qwen3_moe, mixtral, ...), holding one "
                        "token's experts per layer unless --expert-budget says more; "
                        "MLXBUN_EXPERT_OFFLOAD=1")
    add_kv_quant_flag(s, default=os.environ.get("MLXBUN_KV_QUANT", "off"))
    s.add_argument("--fill", choices=("off", "strict"),
                   default=_fill_default(),
                   help="forced-token fill: tokens a grammar leaves no choice about (JSON "
                        "keys, tool-call markup) ride with the next forward instead of a "
                        "decode step each; usage.fill reports them (MLXBUN_FILL, default off)")
    s.add_argument("--prefill-buckets", choices=("auto", "on", "off"),
                   default=os.environ.get("MLXBUN_PREFILL_BUCKETS", "auto"),
                   help="split prefill chunks into power-of-two lengths so only known query "
                        "shapes run (auto: off, as measured on an H200; MLXBUN_PREFILL_BUCKETS)")


def _fill_default() -> str:
    """MLXBUN_FILL (or its alias MLXBUN_GRAMMAR_JUMP); a wrong value is said at start."""
    from .env_readers import GRAMMAR_JUMP, parse_fill

    raw = os.environ.get("MLXBUN_FILL", os.environ.get("MLX_BUN_FILL"))
    try:
        return parse_fill(raw) if raw else parse_fill(os.environ.get(GRAMMAR_JUMP))
    except ValueError:
        return "off"


def add_process_flags(s: argparse.ArgumentParser) -> None:
    """Who may call, what requests may reach, logging, isolation and the listening socket."""
    s.add_argument("--api-key", default=os.environ.get("MLXBUN_API_KEY") or None,
                   help="require 'Authorization: Bearer KEY' on every route; admin routes "
                        "then also answer remote clients (default: no key, admin loopback-only)")
    s.add_argument("--cors", action=ReplacingAppend, default=_env_list("MLXBUN_CORS"),
                   metavar="ORIGIN",
                   help="let web pages of ORIGIN (https://app.example.com) use this server "
                        "and read its answers (repeatable; env MLXBUN_CORS, comma-separated); "
                        "'*' opens the API routes to every site, never the admin routes or "
                        "the web chat (docs/security.md)")
    s.add_argument("--adapter", "--adapter-path", dest="adapter", default=None, metavar="DIR",
                   help="mount a LoRA adapter (mlx-lm or PEFT directory) at start-up and use it "
                        "for requests that name none (id: the directory name)")
    s.add_argument("--adapter-mixing", choices=("on", "off"), default=None,
                   help="rows of different LoRA adapters share one batch (default on; env "
                        "MLXBUN_ADAPTER_MIXING); off runs one adapter set per batch")
    s.add_argument("--grammar-backend", default=None,
                   help="structured-output backend: llguidance (default) or xgrammar "
                        "(pip install 'mlxbun[xgrammar]')")
    s.add_argument("--allow-private-media", action="store_true",
                   default=os.environ.get("MLXBUN_ALLOW_PRIVATE_MEDIA", "").lower()
                   in ("1", "true", "yes", "on"),
                   help="let image/audio/video URLs reach private, loopback and link-local "
                        "hosts (a NAS on the LAN); refused by default")
    s.add_argument("--keep-volatile-system", action="store_true",
                   help="keep per-client metadata at the top of Anthropic system prompts "
                        "(Claude Code's billing header); by default it is dropped so the "
                        "prefix cache survives client updates (MLXBUN_KEEP_VOLATILE_SYSTEM=1)")
    s.add_argument("--log-level", default=os.environ.get("MLXBUN_LOG_LEVEL", "info"))
    s.add_argument("--isolate", action="store_true",
                   help="run the engine as a child process behind a crash-proof proxy")
    s.add_argument("--model-pool", type=int, default=1, metavar="N",
                   help="with --isolate: at most N resident model engines, routed by the "
                        "request's model field (least recently used drains first)")
    add_pool_flags(s)
    s.add_argument("--unix", default=None, metavar="SOCKET",
                   help="listen on a unix socket instead of TCP (the engine half of --isolate)")
    s.add_argument("--no-open", action="store_true",
                   help="do not open the web app in a browser "
                        "(it opens only on an interactive start)")
    add_connection_flags(s)
    add_ssd_cache_flags(s)
    add_distributed_flags(s)


class ReplacingAppend(argparse._AppendAction):
    """``append``, where the first typed value replaces the default (the environment's
    list) instead of adding to it: flags win over ``MLXBUN_*``."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None
                 ) -> None:
        if getattr(namespace, self.dest, None) is self.default:
            setattr(namespace, self.dest, None)
        super().__call__(parser, namespace, values, option_string)


def _env_list(var: str) -> list[str] | None:
    """A comma- or space-separated ``var`` as a list (None when unset or empty)."""
    items = [v for v in re.split(r"[,\s]+", os.environ.get(var, "")) if v]
    return items or None


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be a positive number of seconds")
    return value


def _rate(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError("must be bytes per second, 0 or more")
    return value


def add_connection_flags(s: argparse.ArgumentParser) -> None:
    """How many connections the listening socket keeps, and how long each may dawdle
    (server/connections.py; docs/server.md, "Connections")."""
    s.add_argument("--max-connections", type=_positive_int, default=None, metavar="N",
                   help="open connections at most (default 1024, fewer when the open-file "
                        "limit is low); a newcomer past it closes the longest-idle one, or "
                        "gets a 503 when every connection runs a request")
    s.add_argument("--idle-timeout", type=_seconds, default=5.0, metavar="S",
                   help="close a connection that sends nothing for S seconds, before its "
                        "first request or between requests (default %(default)s)")
    s.add_argument("--header-timeout", type=_seconds, default=20.0, metavar="S",
                   help="a request's line and headers must arrive within S seconds of its "
                        "first byte, else 408; also the grace before --body-min-rate "
                        "applies (default %(default)s)")
    s.add_argument("--body-min-rate", type=_rate, default=1024.0, metavar="BYTES_PER_S",
                   help="after that grace, a request body must arrive at this average rate "
                        "or more, else 408 (default %(default)s; 0: no rate)")


def add_distributed_flags(s: argparse.ArgumentParser) -> None:
    """``--distributed`` and its companions: one model across the ranks of an ``mlx.launch``
    group (docs/distributed.md)."""
    s.add_argument("--distributed", action="store_true",
                   help="serve one model across every rank started by mlx.launch: rank 0 "
                        "answers HTTP, each rank holds a shard (docs/distributed.md)")
    s.add_argument("--pipeline", action="store_true",
                   help="with --distributed: split the layers across ranks (pipeline "
                        "parallel) instead of each layer's matrices (tensor parallel)")
    s.add_argument("--distributed-backend", default="any",
                   choices=("any", "ring", "jaccl", "mpi", "nccl"),
                   help="with --distributed: the mx.distributed backend (default: the one "
                        "mlx.launch set up)")
    s.add_argument("--distributed-timeout", type=float, default=10.0, metavar="S",
                   help="with --distributed: a rank silent this long means the group is "
                        "broken: rank 0 answers 503 and exits (default 10)")


def add_pool_flags(s: argparse.ArgumentParser) -> None:
    """The managed pool (with --isolate) and the config file."""
    from .config import keep_alive_arg

    s.add_argument("--keep-alive", type=keep_alive_arg, default=None, metavar="DURATION",
                   help="with --isolate: unload an engine idle this long after its last reply "
                        "(\"5m\", seconds, 0: right after the reply, -1: never; default: never); "
                        "a request's keep_alive field wins")
    s.add_argument("--pin", dest="pins", action="append", default=None, metavar="MODEL",
                   help="with --isolate: keep MODEL (an id or alias) loaded from start-up on, "
                        "never evicted or unloaded (repeatable)")
    s.add_argument("--allow-model", dest="allow_models", action="append", default=None,
                   metavar="MODEL", help="with --isolate: serve only these models (ids or "
                   "aliases, repeatable; the default and pinned ones are always allowed); "
                   "others get a 404")
    s.add_argument("--config", dest="config_file", default=None, metavar="FILE",
                   help="config file (default: mlxbun.yaml in $MLXBUN_HOME when it exists; "
                        "env MLXBUN_CONFIG); flags and MLXBUN_* variables win over it")


def add_kv_quant_flag(p: argparse.ArgumentParser, default: str, alias: str = "",
                      extra: tuple[str, ...] = ()) -> None:
    """``--kv-quant off|4|8``: uniform affine KV quantization, group 64, mlx-lm's
    ``kv_bits`` scheme (``fit`` also takes its older spelling, ``--kv-bits``, and the
    ``extra`` choices it bills: ``config``); ``serve`` also takes ``config[:PATH]``
    (per-layer bits, kv_config.json) and ``turbo[:kXvY]``."""
    if alias:  # fit: the uniform schemes and the caller's extra ones
        p.add_argument("--kv-quant", alias, dest="kv_quant", default=default,
                       choices=("off", "4", "8", *extra),
                       help="bill the KV cache at off (the model's dtype), 4 or 8 bits"
                            + (", or config (each layer at its kv_config.json bits)"
                               if "config" in extra else ""))
        return
    p.add_argument("--kv-quant", dest="kv_quant", default=default, type=_kv_quant,
                   metavar="off|4|8|config[:PATH]|turbo[:kXvY]",
                   help="KV-cache quantization: off (the model's dtype, default), 4 or 8 bits "
                        "(group 64, mlx-lm's kv_bits scheme), config (per-layer bits from the "
                        "model's kv_config.json, or config:PATH), turbo[:kXvY] (Hadamard-"
                        "rotated keys at X bits, values at Y; default k8v3): less memory "
                        "per token, a longer max safe context, somewhat slower decode")


def _kv_quant(text: str) -> str:
    """The flag's syntax, checked at parse time (a config file is read at load)."""
    from .kvquant import parse

    low = text.strip().lower()
    if low == "config" or low.startswith("config:"):
        return text.strip()
    try:
        parse(low)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--kv-quant ")) from None
    return low


def add_selection_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", dest="model", default=None,
                   help="path or query; wins over the positional and --query")
    p.add_argument("--query", "-q", dest="query", default=None,
                   help="a query matching a local model id (lowest-precedence selector)")


def add_ssd_cache_flags(p: argparse.ArgumentParser) -> None:
    """--ssd-cache DIR, --ssd-cache-max GB, --ssd-cache-verify, --ssd-demote-idle S."""
    from .kvstore.flags import add_flags

    add_flags(p)
