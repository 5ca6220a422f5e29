"""The engine facade the surfaces talk to.

Surfaces hand it a request body in OpenAI chat or completion shape; it asks the
plugins (through hooks only) to render the prompt and parse tool calls, and
streams protocol-neutral events back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import AsyncIterator, Optional

from .. import plugins
from ..grammar import registry as grammars
from ..errors import APIError, BadRequest
from ..model import LoadedModel, LoadOptions
from .sampling import SamplingParams, max_tokens_from, stop_sequences
from .session import GenerationRequest
from .worker import GenerationJob, ModelWorker

log = logging.getLogger("mlxbun.engine")

MEDIA_PART_KINDS = {"image_url": "image", "image": "image", "input_audio": "audio",
                    "audio": "audio", "audio_url": "audio", "video_url": "video", "video": "video"}


@dataclass
class Prepared:
    """A request ready to run, plus what the surface needs to answer it."""

    request: GenerationRequest
    warning: Optional[str] = None


class Engine:
    def __init__(self, model: LoadedModel, *, worker: Optional[ModelWorker] = None,
                 defaults: Optional[dict] = None, max_tokens: Optional[int] = None,
                 draft=None):
        self.model = model
        self.draft = draft  # a DraftSource: every request then decodes speculatively
        self.worker = worker or ModelWorker()
        # generation_config.json values, then operator flags on top; requests win over both
        self.defaults = {**model.generation_defaults, **(defaults or {})}
        self.max_tokens = max_tokens
        self.started_at = int(time.time())
        self._prepare_lock = threading.Lock()
        self.requests = 0

    @classmethod
    def load(cls, name, options=None, *, progress=True, **kw) -> "Engine":
        """Load ``name`` on a fresh worker thread (where it must live) and wrap it."""
        from .. import loader

        options = options or LoadOptions()
        worker = ModelWorker()
        model = worker.run_sync(lambda: loader.load(name, options, progress=progress))
        draft = worker.run_sync(lambda: plugins.hook().draft_source(model=model, options=options))
        return cls(model, worker=worker, draft=draft, **kw)

    # -- preparation --------------------------------------------------------
    def sampling(self, body: dict) -> SamplingParams:
        if "stream" in body and not isinstance(body["stream"], bool):
            raise BadRequest("stream must be of type bool", param="stream")
        return SamplingParams.from_body(body, self.defaults)

    # Rendering a template and compiling a grammar can take a while (a first JSON
    # schema on a 150k vocabulary: hundreds of ms); off the event loop, other streams flow.
    # One preparation at a time keeps the grammar cache and tokenizer single-threaded.
    async def aprepare_chat(self, body: dict) -> Prepared:
        return await asyncio.to_thread(self._serialized, self.prepare_chat, body)

    async def aprepare_completion(self, body: dict) -> Prepared:
        return await asyncio.to_thread(self._serialized, self.prepare_completion, body)

    def _serialized(self, fn, body):
        with self._prepare_lock:
            return fn(body)

    def _require_generative(self):
        if self.model.kind != "generate":
            raise BadRequest(f"model {self.model.id} is an embedding model: it serves "
                             "POST /v1/embeddings only", param="model")

    def prepare_chat(self, body: dict) -> Prepared:
        self._require_generative()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages required", param="messages")
        sampling = self.sampling(body)
        limit = max_tokens_from(body, self.max_tokens)
        stop = stop_sequences(body)
        tools = body.get("tools") or None
        if tools is not None and not (isinstance(tools, list)
                                      and all(isinstance(t, dict) for t in tools)):
            raise BadRequest("tools must be a list of objects", param="tools")
        choice = body.get("tool_choice")
        if choice is not None and not (choice in ("none", "auto", "required")
                                       or isinstance(choice, dict)):
            raise BadRequest("tool_choice must be 'none', 'auto', 'required' or an object",
                             param="tool_choice")
        if choice == "none":
            tools = None
        kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise BadRequest("chat_template_kwargs must be an object", param="chat_template_kwargs")
        msgs = [self._normalize_message(m) for m in messages]
        plan = grammars.plan(body, self.model.tokenizer)
        if plan.instruction:  # degrade path: ask in words for what we cannot enforce
            msgs = self._with_instruction(msgs, plan.instruction)
        hook = plugins.hook()
        prompt = hook.render_chat(model=self.model, messages=msgs, tools=tools,
                                  template_kwargs=kwargs,
                                  reasoning_effort=body.get("reasoning_effort"))
        if prompt is None:
            raise APIError(f"no plugin can render a chat prompt for {self.model.id}")
        parser = hook.tool_call_parser(model=self.model, tools=tools) if tools else None
        req = GenerationRequest(prompt_tokens=list(prompt.tokens), sampling=sampling,
                                max_tokens=limit, stop=stop, think_start=prompt.think_start,
                                think_end=prompt.think_end, in_reasoning=prompt.in_reasoning,
                                tool_parser=parser)
        if plan.processor is not None and prompt.in_reasoning and prompt.think_end:
            # the model thinks freely first; the constraint applies to the answer
            plan.processor.start_after(
                self.model.tokenizer.encode(prompt.think_end, add_special_tokens=False))
        return self._constrained(req, plan)

    def _constrained(self, req: GenerationRequest, plan) -> Prepared:
        if plan.processor is not None:
            req.sampling.extra_processors.append(plan.processor)  # last: after bias/penalties
            req.grammar = plan.processor
        req.sampling.check_vocab(self.vocab_size)
        try:
            req.sampler = req.sampling.sampler(self.model.tokenizer)
            req.processors = req.sampling.logits_processors()
        except ValueError as exc:  # mlx-lm's own argument checks
            raise BadRequest(str(exc))
        return Prepared(req, warning=plan.warning)

    @property
    def vocab_size(self) -> int:
        """Rows of the output layer (can exceed the tokenizer's size)."""
        cfg = self.model.config
        return int(cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size")
                   or len(self.model.tokenizer))

    @staticmethod
    def _with_instruction(msgs: list, instruction: str) -> list:
        """Templates often allow one leading system turn: extend it or add one."""
        if msgs and msgs[0]["role"] in ("system", "developer") and isinstance(msgs[0].get("content"), str):
            first = dict(msgs[0], content=(msgs[0]["content"] + "\n\n" + instruction).strip())
            return [first] + msgs[1:]
        return [{"role": "system", "content": instruction}] + msgs

    def prepare_completion(self, body: dict) -> Prepared:
        self._require_generative()
        text = body.get("prompt")
        if not isinstance(text, str) or not text:
            raise BadRequest("prompt must be a non-empty string", param="prompt")
        sampling = self.sampling(body)
        limit = max_tokens_from(body, self.max_tokens)
        tokens = self.model.tokenizer.encode(text)
        if not tokens:
            raise BadRequest("prompt encodes to no tokens", param="prompt")
        req = GenerationRequest(prompt_tokens=tokens, sampling=sampling, max_tokens=limit,
                                stop=stop_sequences(body))
        # no template to inject an instruction into: the degrade path is the Warning alone
        return self._constrained(req, grammars.plan(body, self.model.tokenizer))

    def _normalize_message(self, m) -> dict:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest("each message must be an object with a string role", param="messages")
        m = dict(m)
        if m["role"] == "developer":  # OpenAI's newer name for system; templates know "system"
            m["role"] = "system"
        if m["role"] == "assistant":
            if not isinstance(m.get("reasoning_content"), str) and isinstance(m.get("reasoning"), str):
                m["reasoning_content"] = m["reasoning"]
            if m.get("tool_calls"):
                m["tool_calls"] = [self._template_tool_call(c) for c in m["tool_calls"]]
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text":
                    if not isinstance(part.get("text"), str):
                        raise BadRequest("text content parts need a string 'text'", param="messages")
                    texts.append(part["text"])
                elif kind in MEDIA_PART_KINDS:
                    self._require_media(MEDIA_PART_KINDS[kind])
                else:
                    raise BadRequest(f"unsupported content part type: {kind!r}", param="messages")
            m["content"] = "".join(texts)
        elif content is None:
            m["content"] = "" if not m.get("tool_calls") else None
        elif not isinstance(content, str):
            raise BadRequest("message content must be a string or an array of parts", param="messages")
        return m

    @staticmethod
    def _template_tool_call(call) -> dict:
        """Templates iterate arguments as a mapping; the wire carries a JSON string."""
        if not isinstance(call, dict):
            raise BadRequest("tool_calls entries must be objects", param="messages")
        call = dict(call)
        fn = call.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BadRequest("tool_calls entries need a function object with a name",
                             param="messages")
        fn = dict(fn)
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                fn["arguments"] = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                pass
        call["function"] = fn
        return call

    def _require_media(self, kind: str):
        pipeline = plugins.hook().media_pipeline(model=self.model, kind=kind)
        if pipeline is None:
            if kind == "image":
                raise BadRequest(f"model has no vision sidecar: {self.model.id} does not accept images")
            raise BadRequest(f"model {self.model.id} does not accept {kind} input")
        raise BadRequest(f"{kind} input is not supported yet by {self.model.id}")

    # -- running --------------------------------------------------------------
    def effective_limit(self, req: GenerationRequest) -> Optional[int]:
        ctx = self.model.context_window
        if ctx is None:
            return req.max_tokens
        room = ctx - len(req.prompt_tokens)
        if room <= 0:
            raise APIError(f"prompt has {len(req.prompt_tokens)} tokens; the context window "
                           f"is {ctx}", status=400, type="memory_admission",
                           code="context_over_budget")
        return room if req.max_tokens is None else min(req.max_tokens, room)

    def start(self, req: GenerationRequest) -> GenerationJob:
        """Queue a generation; raises QueueFull / admission errors before anything streams."""
        limit = self.effective_limit(req)
        job = GenerationJob(asyncio.get_running_loop(), req, self.model.model,
                            self.model.tokenizer, limit, self.draft)
        self.requests += 1
        return self.worker.submit(job)

    async def events(self, job: GenerationJob) -> AsyncIterator[tuple]:
        """Yield the job's events; leaving early (disconnect) cancels the job."""
        try:
            while True:
                for ev in await job.events.get():
                    yield ev
                    if ev[0] == "done":
                        self._log_finish(ev[1])
                        return
        finally:
            job.cancel()

    @staticmethod
    def _log_finish(fin):
        u, t = fin.usage, fin.timings
        log.info("%s · prompt %d tok · %d tok out · ttft %.0f ms · %.1f tok/s · %s lane",
                 fin.reason, u.prompt_tokens, u.completion_tokens, 1e3 * t.get("ttft_s", 0),
                 t.get("decode_tps", 0.0), u.lane)

    async def embed(self, texts: list, instruction: Optional[str] = None):
        if self.model.kind != "embedding":  # answer now, not after queued generations
            raise BadRequest(f"model {self.model.id} is not an embedding model")
        hook = plugins.hook()
        result = await self.worker.call(
            lambda: hook.embed(model=self.model, texts=texts, instruction=instruction))
        if result is None:
            raise BadRequest(f"model {self.model.id} is not an embedding model")
        return result
