"""The Curve Designer's backends and pages: POST /signal, POST /generate, GET /curves,
/curve-terrain and /dag.

/signal is one forward pass over a prompt (rendered as a single user turn) whose
next-token log-probs are binned over the designer's x-axis, so the page can draw the
distribution under the curve. /generate samples the same prompt with the drawn curve (the
``hlg.points`` sampler, :mod:`..engine.hlg`) or with the model's default recipe, so the two
can be read side by side. Both run through the engine's worker (never interleaved with a
serving step). The spec gives both permissive CORS (``*``) so the page may be opened from a
file; here they follow the guard like every route: the page served at /curves is
same-origin, and ``--cors ORIGIN`` (``null`` for a page opened from a file) lets another
page in (:mod:`.origin`). Errors here are ``{"error": "message"}``, the designer's own
shape.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np
from blacksheep import Request, Response
from blacksheep.contents import Content

from ..engine.hlg import X_RANGE, parse_points
from ..engine.reply import gather
from ..errors import APIError, BadRequest
from ..server.common import Handler, json_response, read_body
from ..server.generation import start_choices

if TYPE_CHECKING:
    from ..engine.core import Engine
    from ..engine.request import ChatRequest
    from ..server.state import App

BINS = 80
AXIS = (-20.0, 0.0)  # the designer's x-axis: log-probs below -20 land in the first bin
SIGNAL_MAX_TOKENS = 4096  # one forward pass, no chunking: a long prompt is refused
MAX_SAMPLES, MAX_NEW = 8, 256
assert AXIS[0] >= X_RANGE[0]


def _answer(data: object, status: int = 200) -> Response:
    return json_response(data, status)


def _error(exc: Exception, what: str) -> Response:
    if isinstance(exc, APIError) and exc.status < 500:
        return _answer({"error": exc.message}, exc.status)
    return _answer({"error": f"{what} failed: {exc}"}, 500)


def histogram(logprobs: list[float], bins: int = BINS,
              axis: tuple[float, float] = AXIS) -> list[int]:
    """How many tokens fall in each of ``bins`` equal buckets of ``axis`` (clamped at both
    ends; -inf, a masked token, is left out)."""
    lo, hi = axis
    values = np.asarray(logprobs, dtype=np.float64)
    values = values[np.isfinite(values)]
    index = np.clip(((values - lo) / (hi - lo) * bins).astype(np.int64), 0, bins - 1)
    counts: list[int] = np.bincount(index, minlength=bins).tolist()
    return counts


def looks_like_junk(text: str) -> bool:
    """The coherence heuristic: empty, replacement characters, mostly symbols, or one word
    repeated on and on."""
    stripped = text.strip()
    if not stripped or "\ufffd" in stripped:
        return True
    wordish = sum(c.isalnum() or c.isspace() for c in stripped) / len(stripped)
    words = re.findall(r"\w+", stripped.lower())
    repeats = max((words.count(w) for w in set(words)), default=0)
    return wordish < 0.6 or (len(words) >= 8 and repeats / len(words) > 0.5)


def _prompt(body: dict[str, Any]) -> str:
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise BadRequest("prompt must be a non-empty string", param="prompt")
    return prompt


def _int(body: dict[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    value = body.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise BadRequest(f"{name} must be an integer from {lo} to {hi}", param=name)
    return value


def _curve(body: dict[str, Any]) -> list[list[float]] | None:
    """The drawn points when they shape sampling (≥ 2 points, ``default`` not true);
    a non-monotone curve is a 400."""
    curve = body.get("curve")
    if curve is None or body.get("default") is True:
        return None
    if not isinstance(curve, dict) or not isinstance(curve.get("points"), list):
        raise BadRequest("curve must be an object {points: [...]}", param="curve")
    if len(curve["points"]) < 2:
        return None
    return [list(p) for p in parse_points(curve["points"], "curve.points")]


def recipe(engine: Engine) -> dict[str, float]:
    """The model's default chat recipe (generation_config.json and the server flags)."""
    d = engine.defaults
    return {"temperature": float(d.get("temperature") or 0.7),
            "topP": float(d.get("top_p") or 0), "topK": int(d.get("top_k") or 0)}


def register(app: App, engine: Engine) -> None:
    async def signal(request: Request) -> Response:
        try:
            body = await read_body(request)
            prompt = _prompt(body)
            req = engine.parse_chat({"messages": [{"role": "user", "content": prompt}]})
            tokens = (await engine.prepare(req, compile_grammar=False)).request.prompt_tokens
            if len(tokens) > SIGNAL_MAX_TOKENS:
                raise BadRequest(f"prompt has {len(tokens)} tokens; /signal reads at most "
                                 f"{SIGNAL_MAX_TOKENS}", param="prompt")
            logprobs = await engine.worker.call(lambda: next_token_logprobs(engine, tokens))
        except Exception as exc:
            return _error(exc, "signal")
        return _answer({"bins": histogram(logprobs), "vocab": len(logprobs)})

    async def generate(request: Request) -> Response:
        try:
            body = await read_body(request)
            prompt = _prompt(body)
            n = _int(body, "n", 3, 1, MAX_SAMPLES)
            max_tokens = _int(body, "max_tokens", 80, 1, MAX_NEW)
            seed = _int(body, "seed", 0, 0, 2**32 - 1)
            points = _curve(body)
            chat: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}],
                                    "n": n, "max_tokens": max_tokens, "seed": seed}
            if points is not None:
                chat["hlg"] = {"points": points}
            else:
                r = recipe(engine)
                chat.update(temperature=r["temperature"], top_p=r["topP"], top_k=r["topK"])
            texts = await _sample(engine, engine.parse_chat(chat))
        except Exception as exc:
            return _error(exc, "generate")
        out: dict[str, Any] = {"mode": "curve" if points is not None else "default"}
        if points is None:
            out["recipe"] = recipe(engine)
        out.update(n=n, seed=seed, samples=[{"text": t, "junk": looks_like_junk(t)}
                                            for t in texts])
        return _answer(out)

    async def preflight(request: Request) -> Response:
        """A plain OPTIONS; a browser's preflight is the guard's (it knows --cors)."""
        resp = Response(204, None, None)
        resp.add_header(b"Allow", b"POST, OPTIONS")
        return resp

    for path, handler in (("/signal", signal), ("/generate", generate)):
        app.router.add_post(path, handler)
        app.router.add_options(path, preflight)
    register_pages(app)


def register_pages(app: App) -> None:
    """The designer and its two companion pages: static, ``no-store``, open without the
    key (the page asks for it when /signal wants one); 404 for a page not shipped."""
    from .pages import CURVE_PAGES, load_files

    files = load_files()
    for route, name in CURVE_PAGES.items():
        if name in files:
            app.router.add_get(route, _page(files[name]))
            app.state.guard.open_route(route)


def _page(body: bytes) -> Handler:
    async def page(request: Request) -> Response:
        resp = Response(200, None, Content(b"text/html; charset=utf-8", body))
        resp.add_header(b"Cache-Control", b"no-store")
        resp.add_header(b"X-Content-Type-Options", b"nosniff")
        return resp
    return page


async def _sample(engine: Engine, req: ChatRequest) -> list[str]:
    """Each choice's text; if one fails or the handler is cancelled, the rest stop too."""
    gens = await start_choices(engine, req)
    try:
        texts = []
        for gen in gens:
            texts.append(gather([ev async for ev in gen.events()]).content)
        return texts
    finally:
        for gen in gens:
            gen.cancel()


def next_token_logprobs(engine: Engine, tokens: list[int]) -> list[float]:
    """One forward pass over ``tokens`` (on the worker thread): the next token's log-probs."""
    import mlx.core as mx

    from .. import cache_ops

    model = engine.model.model
    logits = model(mx.array(tokens)[None], cache=cache_ops.make(model))[0, -1]
    logits = logits.astype(mx.float32)
    values: list[float] = (logits - mx.logsumexp(logits)).tolist()
    return values
