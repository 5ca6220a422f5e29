"""What the web app's lab pages need beyond the job routes: POST /api/dataset/inspect,
POST /api/dataset/upload, GET /api/dataset/local.

Admin routes like every ``/api/*`` route (loopback clients only unless an API key is
set); they read and write dataset files, never start a job. Errors are
``{"ok": false, "error": ...}``.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blacksheep import Request, Response

from ..errors import BadRequest
from ..jobs import dataset_probe
from ..jobs.quantize import locate
from ..server.common import guarded, json_response, read_body
from . import state as webapp_state
from .hub import ok_error

if TYPE_CHECKING:
    from ..engine.core import Engine
    from ..server.state import App

TOKENIZERS_KEPT = 2


class _Tokenizers:
    """Tokenizers for counting, loaded apart from the engine's (that one belongs to the
    model worker's thread), the last few kept by model directory."""

    def __init__(self) -> None:
        self._kept: OrderedDict[Path, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: Path) -> Any:
        from mlx_lm.utils import load_tokenizer

        with self._lock:
            if path in self._kept:
                self._kept.move_to_end(path)
                return self._kept[path]
            tok = load_tokenizer(path)
            self._kept[path] = tok
            while len(self._kept) > TOKENIZERS_KEPT:
                self._kept.popitem(last=False)
            return tok


def register(app: App, engine: Engine) -> None:
    home = webapp_state.of(app).jobs.home
    tokenizers = _Tokenizers()

    def model_dir(model: Any) -> Path | None:
        if model in (None, "", engine.model.id):
            path = getattr(engine.model, "path", None)
            return Path(path) if path and Path(path).is_dir() else None
        return locate(model)

    def inspect(body: dict[str, Any]) -> dict[str, Any]:
        max_len = body.get("max_seq_length")
        if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int)
                                    or max_len < 1):
            raise BadRequest("max_seq_length must be a positive integer", param="max_seq_length")
        samples = body.get("samples", 3)
        if isinstance(samples, bool) or not isinstance(samples, int):
            raise BadRequest("samples must be an integer", param="samples")
        counter = None
        if body.get("count_tokens", True):
            where = model_dir(body.get("model"))
            if where is not None:
                counter = dataset_probe.token_counter(tokenizers.get(where))
        out = dataset_probe.inspect(body.get("path"), counter, max_len, samples)
        out["token_model"] = None if counter is None else str(body.get("model") or engine.model.id)
        return out

    @guarded(ok_error)
    async def inspect_route(request: Request) -> Response:
        body = await read_body(request)
        return json_response(await asyncio.to_thread(inspect, body))

    @guarded(ok_error)
    async def upload(request: Request) -> Response:
        body = await read_body(request)
        return json_response(await asyncio.to_thread(dataset_probe.save_upload, body, home))

    @guarded(ok_error)
    async def local(request: Request) -> Response:
        rows = await asyncio.to_thread(dataset_probe.local_datasets, home)
        return json_response({"ok": True, "datasets": rows})

    r = app.router
    r.add_post("/api/dataset/inspect", inspect_route)
    r.add_post("/api/dataset/upload", upload)
    r.add_get("/api/dataset/local", local)
