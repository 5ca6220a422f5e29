"""Media for checkpoints mlx-lm serves as text: mlx-vlm's processors and towers.

mlx-vlm (a maintained MLX library) ships the image/audio towers, the processors
that turn a picture into patches and expand each media placeholder into the
model's soft tokens, and the multimodal forward pass (Gemma 4's bidirectional
attention over image tokens, Qwen's 3D rotary positions). A :class:`VlmPipeline`
uses all of it for one loaded model:

* text-only requests never come here: they keep mlx-lm's model, speed and tokens;
* the processor loads on the first media request (any thread), the towers on
  its first run (the worker thread). The mlx-vlm model borrows every language
  weight from the loaded mlx-lm model (same names, same arrays), so only the
  towers take new memory;
* generation is mlx-vlm's own ``generate_step`` with the request's sampler and
  logits processors, so greedy output is the library's by construction.

Family plugins and the generic plugin call :func:`pipeline_for`; nothing here
knows a family.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import threading
import warnings
from pathlib import Path
from typing import cast

from ..errors import BadRequest
from ..media import parts as media_parts
from ..model import LoadedModel, MediaPrompt

log = logging.getLogger("mlxbun.media")

# substrings of checkpoint tensor names that belong to a tower of each kind
TOWER_KEYS = {"image": ("vision_tower.", "visual.", "vision_model.", "embed_vision.",
                        "multi_modal_projector."),
              "audio": ("audio_tower.", "embed_audio.", "audio_model.")}
_NOT_INPUTS = ("input_ids", "pixel_values", "attention_mask")
_pipelines_lock = threading.Lock()  # /v1/models and preparation may ask at the same time


@functools.cache
def _vlm_models_dir() -> Path | None:
    spec = importlib.util.find_spec("mlx_vlm")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "models"


def supports_model_type(model_type) -> bool:
    """Whether the installed mlx-vlm has a model definition for ``model_type``."""
    root = _vlm_models_dir()
    return bool(root and model_type and (root / str(model_type)).is_dir())


def weight_names(path: Path) -> set:
    """Tensor names of a checkpoint, from its index or safetensors headers (no data read)."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        return set(json.loads(index.read_text()).get("weight_map", {}))
    names: set = set()
    for f in path.glob("*.safetensors"):
        with open(f, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            names |= set(json.loads(fh.read(size))) - {"__metadata__"}
    return names


def tower_kinds(path: Path, config: dict) -> frozenset:
    """Media kinds this checkpoint can take through mlx-vlm: the library knows the
    architecture, the config declares the tower, and the weights ship it."""
    if not supports_model_type(config.get("model_type")):
        return frozenset()
    try:
        names = weight_names(Path(path))
    except (OSError, ValueError):
        return frozenset()
    kinds = set()
    for kind, section in (("image", "vision_config"), ("audio", "audio_config")):
        if config.get(section) and any(k in n for n in names for k in TOWER_KEYS[kind]):
            kinds.add(kind)
    return frozenset(kinds)


def pipeline_for(model: LoadedModel, kind: str, allowed=("image", "audio", "video")):
    """The model's pipeline when it can take ``kind`` (one pipeline per model), else None.

    ``allowed`` is what the family serves (video needs a tower that takes frames:
    it is served wherever the image tower is and the family allows it).
    """
    with _pipelines_lock:
        pipe = model.extras.get("media_pipeline")
        if pipe is None:
            if _vlm_models_dir() is None and model.config.get("vision_config"):
                log.warning("%s ships a vision tower, but mlx-vlm is not installed: media "
                            "parts get a 400 (pip install 'mlxbun[media]')", model.id)
            kinds = set(tower_kinds(model.path, model.config))
            if "image" in kinds:
                kinds.add("video")
            pipe = VlmPipeline(model, frozenset(k for k in kinds if k in allowed))
            model.extras["media_pipeline"] = pipe
    return pipe if kind in pipe.kinds else None


class VlmPipeline:
    """One model's mlx-vlm processor and towers (see the module docstring)."""

    def __init__(self, model: LoadedModel, kinds: frozenset):
        self.model = model
        self.kinds = kinds
        self.kind = ",".join(sorted(kinds))
        self._lock = threading.Lock()
        self._processor = None
        self._config = None
        self._vlm = None

    # -- preparation (any thread) -------------------------------------------------
    def _processor_and_config(self):
        with self._lock:
            if self._processor is None:
                from mlx_vlm.utils import (
                    get_model_and_args,
                    load_config,
                    load_image_processor,
                    load_processor,
                    update_module_configs,
                )

                path = self.model.path
                log.info("loading the media processor for %s (mlx-vlm)", self.model.id)
                raw = load_config(path)
                module, _ = get_model_and_args(raw, path)
                config = module.ModelConfig.from_dict(raw)
                self._config = update_module_configs(config, module, raw,
                                                     ["text", "vision", "audio"])
                with warnings.catch_warnings():  # feature extractors warn about their own defaults
                    warnings.simplefilter("ignore", UserWarning)
                    processor = load_processor(
                        path, True, eos_token_ids=getattr(self._config, "eos_token_id", None))
                image_processor = load_image_processor(path)
                if image_processor is not None:
                    processor.image_processor = image_processor
                self._processor = processor
            return self._processor, self._config

    def prepare(self, prompt, items: list) -> MediaPrompt:
        """Expand ``prompt.text``'s media placeholders with the model's processor."""
        from mlx_vlm.utils import VideoMetadata, prepare_inputs

        processor, config = self._processor_and_config()
        by_kind = {k: [i.value for i in items if i.kind == k] for k in media_parts.KINDS}
        extra = {}
        if by_kind["video"]:
            extra["video_metadata"] = [
                VideoMetadata(total_num_frames=v.total_num_frames, fps=v.source_fps,
                              frames_indices=list(v.frames_indices), duration=v.duration_s,
                              height=int(v.frames.shape[1]), width=int(v.frames.shape[2]))
                for v in by_kind["video"]]
        if len(by_kind["audio"]) > 1 and not getattr(processor, "supports_multiple_audio", False):
            raise BadRequest(f"model {self.model.id} takes one audio clip per request",
                             param="messages")
        self._check_slots(prompt.text, processor, by_kind)
        try:
            inputs = prepare_inputs(
                processor, images=by_kind["image"] or None, audio=by_kind["audio"] or None,
                videos=[v.frames for v in by_kind["video"]] or None, prompts=prompt.text,
                image_token_index=getattr(config, "image_token_index", None),
                add_special_tokens=False, **extra)
        except (ValueError, IndexError, KeyError, TypeError) as exc:
            raise BadRequest(f"prompt build failed: {exc}") from exc
        tokens = inputs["input_ids"][0].tolist()
        return MediaPrompt(tokens=tokens, kinds=frozenset(i.kind for i in items),
                           digest=media_parts.digest(items),
                           run=functools.partial(self._run, inputs),
                           resume_from=_after_media(tokens, config), new_cache=self._new_cache)

    def _check_slots(self, text: str, processor, by_kind: dict) -> None:
        """The template must have placed one marker per media part (a template that
        drops, say, images in system turns would otherwise shift every later one)."""
        tok = getattr(processor, "tokenizer", processor)
        for kind, values in by_kind.items():
            if not values:
                continue
            marker = _marker(processor, tok, kind)
            if marker and text.count(marker) != len(values):
                raise BadRequest(f"prompt build failed: the chat template placed "
                                 f"{text.count(marker)} {kind} slot(s) for {len(values)} "
                                 f"{kind} part(s); {kind} parts are only read in user "
                                 "and tool messages", param="messages")

    # -- running (the worker thread) -------------------------------------------
    def _run(self, inputs: dict, sampler, logits_processors, *, prefill_step: int = 0,
             between_chunks=None, prompt_cache=None, start: int = 0):
        """mlx-vlm's generate_step; ``between_chunks(done)`` runs after every
        ``prefill_step`` prompt tokens (it raises to stop a cancelled request; mlx-vlm's
        prompt-cache checkpoints are the hook, so a model that refuses chunked
        prefill reads its prompt whole). ``prompt_cache`` (from :meth:`_new_cache`, or
        a cached prefix holding the first ``start`` tokens, all media among them) is
        filled in place, so the engine can keep it."""
        from mlx_vlm.generate import generate_step

        model = self._vlm_model()
        extra = {k: v for k, v in inputs.items() if k not in _NOT_INPUTS}
        ids, pixels, mask = inputs["input_ids"], inputs.get("pixel_values"), \
            inputs.get("attention_mask")
        if start > 0:  # the media are in the cache: read the text after them only
            extra.update(_positions(model, inputs))
            ids, pixels, mask = ids[:, start:], None, None
        length = ids.shape[-1]
        if between_chunks is not None and 0 < prefill_step < length - 1:
            extra.update(prefill_step_size=prefill_step,
                         prompt_cache_checkpoint=lambda done, _cache: between_chunks(done),
                         prompt_cache_checkpoint_lengths=list(
                             range(prefill_step, length - 1, prefill_step)))
        yield from generate_step(ids, model, pixels, mask, max_tokens=-1, sampler=sampler,
                                 logits_processors=logits_processors or None,
                                 prompt_cache=prompt_cache, **extra)

    def _new_cache(self) -> list:
        """An empty KV cache of mlx-vlm's language model (worker thread)."""
        from mlx_vlm.models.cache import make_prompt_cache

        return make_prompt_cache(self._vlm_model().language_model)

    def _vlm_model(self):
        if self._vlm is None:
            self._vlm = load_towers(self.model)
        return self._vlm


_MEDIA_TOKEN_KEYS = ("image_token_index", "image_token_id", "video_token_index",
                     "video_token_id", "audio_token_index", "audio_token_id")


def _after_media(tokens: list[int], config) -> int | None:
    """Where the text after the last media soft token starts: a cached prefix at least
    this long holds every media token, so the rest reads as text. None when the config
    names no media token id (such a prompt is always read whole)."""
    ids = {v for k in _MEDIA_TOKEN_KEYS if isinstance(v := getattr(config, k, None), int)}
    last = max((i for i, t in enumerate(tokens) if t in ids), default=None)
    return None if last is None else last + 1


def _positions(model, inputs: dict) -> dict:
    """The whole prompt's rotary positions for a model that places media tokens on a
    grid (Qwen's 3D positions): a read that starts after the media continues them
    (the language model slices them at its cache offset). None needed otherwise."""
    lm = model.language_model
    if not hasattr(lm, "get_rope_index"):
        return {}
    position_ids, rope_deltas = lm.get_rope_index(
        inputs["input_ids"], inputs.get("image_grid_thw"), inputs.get("video_grid_thw"),
        inputs.get("attention_mask"))
    return {"position_ids": position_ids, "rope_deltas": rope_deltas}


def _marker(processor, tok, kind: str) -> str | None:
    """The placeholder string the processor expands for ``kind``."""
    name = {"image": "image_token", "audio": "audio_token", "video": "video_token"}[kind]
    return getattr(processor, name, None) or getattr(tok, name, None)


def load_towers(model: LoadedModel):
    """mlx-vlm's model for ``model.path`` with the language weights borrowed from the
    loaded mlx-lm model: only the towers are read from disk."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_vlm.utils import load_model

    vlm = load_model(Path(model.path), lazy=True)
    mine = dict(cast("list[tuple[str, mx.array]]", tree_flatten(vlm.parameters())))
    theirs = cast("list[tuple[str, mx.array]]", tree_flatten(model.model.parameters()))
    shared = [(k, v) for k, v in theirs
              if k in mine and mine[k].shape == v.shape and mine[k].dtype == v.dtype]
    vlm.update(tree_unflatten(shared))
    mx.eval(vlm.parameters())
    log.info("media towers ready for %s (%d language tensors shared, %d loaded)",
             model.id, len(shared), len(mine) - len(shared))
    return vlm
