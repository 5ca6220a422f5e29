"""Synthesis: saved conversations → articles, by the served model, as a stream of events.

The stages (the spec's names): **ingest** the conversations, skipping those already read
unchanged; **segment** each transcript into chunks a small context holds; **extract**
topics from each chunk with one generation whose answer is constrained by a JSON schema
(so even a tiny model's answer parses into ``{"topics": [...]}``); **route** each topic to
an article stem, existing or new; **create** new articles; **section-route** facts to the
``Facts`` section; **patch** existing articles with the facts they lack; **link** topics
of one conversation to each other (``See also``); **wikify**: the index is refreshed as
each article is written, and the conversations are marked read.

A dry run stops after segment and lists what extract would ask; it calls no model and
writes nothing. Events are dicts (``stage``, ``log``, ``done``, ``summary``; a failure is
raised to the caller, who reports it). The generations go through ``engine.start`` like any
API request, so synthesis shares the engine fairly; :meth:`Synthesis.cancel` stops the one
running within a decode step.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import APIError
from ..events import Content, Done
from . import articles
from .vault import Vault

STAGES = ["ingest", "segment", "extract", "route", "create", "section-route", "patch", "link",
          "wikify"]
CHUNK_CHARS = 2000
MAX_TOKENS = 384
MAX_CONVERSATIONS = 500
PROMPT = ("You keep a personal wiki. From the conversation excerpt, list the topics worth "
          "remembering: a short title, a one-sentence summary, facts stated in the "
          "conversation, and related topic titles. Answer with JSON only.")
SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["topics"], "additionalProperties": False,
    "properties": {"topics": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "required": ["title", "summary", "facts", "related"],
        "additionalProperties": False,
        "properties": {
            "title": {"type": "string", "minLength": 1, "maxLength": 60},
            "summary": {"type": "string", "maxLength": 240},
            "facts": {"type": "array", "maxItems": 4,
                      "items": {"type": "string", "minLength": 1, "maxLength": 160}},
            "related": {"type": "array", "maxItems": 3,
                        "items": {"type": "string", "minLength": 1, "maxLength": 60}}}}}}}


@dataclass
class Conversation:
    """One saved chat, as synthesis reads it: ``(role, text)`` turns of its active branch."""

    id: str
    title: str
    turns: list[tuple[str, str]]

    def digest(self) -> str:
        return hashlib.sha1(json.dumps(self.turns).encode()).hexdigest()

    def chunks(self, size: int = CHUNK_CHARS) -> list[str]:
        """The transcript in pieces of at most ``size`` characters, cut between turns
        where it can be (a longer turn is cut inside)."""
        out: list[str] = []
        cur = ""
        for role, text in self.turns:
            line = f"{role.capitalize()}: {' '.join(text.split())}\n"
            while line:
                room = size - len(cur)
                if len(line) <= room:
                    cur, line = cur + line, ""
                elif cur:
                    out.append(cur)
                    cur = ""
                else:
                    out.append(line[:size])
                    line = line[size:]
        return out + [cur] if cur else out


@dataclass
class Topic:
    title: str
    summary: str
    facts: list[str]
    related: list[str]
    source: str  # the conversation's title


def _line(value: Any, limit: int) -> str:
    return " ".join(str(value).split())[:limit] if isinstance(value, str) else ""


def parse_topics(text: str, source: str) -> list[Topic]:
    """The topics of one answer; ValueError when it is not the schema's shape."""
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("topics"), list):
        raise ValueError("no topics list")
    out = []
    for t in data["topics"]:
        if not isinstance(t, dict):
            raise ValueError("a topic is not an object")
        facts = [f for f in (_line(x, 160) for x in t.get("facts") or []) if f]
        related = [r for r in (_line(x, 60) for x in t.get("related") or []) if r]
        out.append(Topic(_line(t.get("title"), 60), _line(t.get("summary"), 240), facts,
                         related, source))
    return out


@dataclass
class Plan:
    """What one run does to the vault, filled in stage by stage."""

    topics: dict[str, list[Topic]] = field(default_factory=dict)  # stem -> topics
    by_conversation: dict[str, set[str]] = field(default_factory=dict)  # id -> stems
    created: list[str] = field(default_factory=list)
    patched: list[str] = field(default_factory=list)


class Synthesis:
    """One run over ``conversations`` into ``vault`` with ``engine``'s model."""

    def __init__(self, vault: Vault, engine: Any, conversations: list[Conversation], *,
                 dry: bool = False, force: bool = False, chunk_chars: int = CHUNK_CHARS,
                 max_tokens: int = MAX_TOKENS):
        self.vault, self.engine, self.conversations = vault, engine, conversations
        self.dry, self.force = dry, force
        self.chunk_chars, self.max_tokens = chunk_chars, max_tokens
        self.cancelled = False
        self.finished = False
        self.gen: Any = None

    @property
    def active(self) -> bool:
        """Started, and neither finished nor cancelled."""
        return not (self.finished or self.cancelled)

    def cancel(self) -> None:
        self.cancelled = True
        if self.gen is not None:
            self.gen.cancel()

    async def run(self) -> AsyncIterator[dict]:
        """The events of the run, ``done`` and ``summary`` last."""
        try:
            async for event in self._run():
                yield event
        finally:
            self.finished = True

    async def _run(self) -> AsyncIterator[dict]:
        self.vault.require()
        todo = await asyncio.to_thread(self._ingest)
        skipped = len(self.conversations) - len(todo)
        yield _stage("ingest", f"{len(todo)} conversations to read, {skipped} unchanged since "
                     "the last run")
        chunks: list[tuple[Conversation, int, int, str]] = []
        for conv in todo:
            parts = conv.chunks(self.chunk_chars)
            chunks += [(conv, i, len(parts), text) for i, text in enumerate(parts)]
        yield _stage("segment", f"{len(chunks)} chunks of at most {self.chunk_chars} characters")
        if self.dry:
            for conv, i, n, text in chunks:
                yield _log(f"would extract {conv.title!r} part {i + 1}/{n} ({len(text)} chars)")
            for stage in STAGES[2:]:
                yield _stage(stage, "planned (dry run: no model calls, no writes)")
            yield {"type": "done", "message": f"dry run — {len(chunks)} chunks from "
                   f"{len(todo)} conversations would be read; nothing written"}
            yield _summary(dry=True)
            return
        plan = Plan()
        yield _stage("extract", f"asking the model about {len(chunks)} chunks")
        for conv, i, n, text in chunks:
            if self.cancelled:
                return
            yield _log(await self._extract(plan, conv, text, f"{conv.title!r} part {i + 1}/{n}"))
        async for event in self._write(plan, todo):
            yield event

    def _ingest(self) -> list[Conversation]:
        convs = [c for c in self.conversations if any(r == "user" and t for r, t in c.turns)]
        if not self.force:
            convs = [c for c in convs if self.vault.history.source_digest(c.id) != c.digest()]
        return convs[:MAX_CONVERSATIONS]

    async def _extract(self, plan: Plan, conv: Conversation, text: str, where: str) -> str:
        """One generation over one chunk; its topics join ``plan``. A log line."""
        answer = await self._generate(text)
        if answer is None:
            return f"{where}: refused by the engine; skipped"
        try:
            topics = parse_topics(answer, conv.title)
        except ValueError as exc:
            return f"{where}: the answer did not parse ({exc}); skipped"
        kept = 0
        for topic in topics:
            stem = articles.stem_of(topic.title)
            if stem is None:
                continue
            plan.topics.setdefault(stem, []).append(topic)
            plan.by_conversation.setdefault(conv.id, set()).add(stem)
            kept += 1
        return f"{where}: {len(topics)} topics, {kept} with a usable title"

    async def _generate(self, chunk: str) -> str | None:
        body = {"messages": [{"role": "system", "content": PROMPT},
                             {"role": "user", "content": chunk}],
                "max_tokens": self.max_tokens, "temperature": 0,
                "chat_template_kwargs": {"enable_thinking": False},
                "response_format": {"type": "json_schema", "json_schema": {
                    "name": "memory_topics", "strict": True, "schema": SCHEMA}}}
        try:
            self.gen = await self.engine.start(self.engine.parse_chat(body))
        except APIError as exc:
            if exc.status >= 500:
                raise
            return None
        parts: list[str] = []
        async for ev in self.gen.events():
            if isinstance(ev, Content):
                parts.append(ev.text)
            elif isinstance(ev, Done) and ev.finish.reason == "error":
                raise RuntimeError(ev.finish.error or "generation failed")
        self.gen = None
        return "".join(parts)

    async def _write(self, plan: Plan, todo: list[Conversation]) -> AsyncIterator[dict]:
        existing = set(await asyncio.to_thread(self.vault.article_names))
        new = [s for s in plan.topics if s not in existing]
        yield _stage("route", f"{len(plan.topics)} topics: {len(new)} new articles, "
                     f"{len(plan.topics) - len(new)} existing")
        if self.cancelled:
            return
        yield _stage("create", await asyncio.to_thread(self._create, plan, new))
        facts = sum(len(t.facts) for ts in plan.topics.values() for t in ts)
        yield _stage("section-route", f"{facts} facts go to the {articles.FACTS} sections")
        yield _stage("patch", await asyncio.to_thread(self._patch, plan, existing))
        yield _stage("link", await asyncio.to_thread(self._link, plan))
        for conv in todo:
            await asyncio.to_thread(self.vault.history.mark_source, conv.id, conv.digest())
        yield _stage("wikify", f"{len(plan.created) + len(plan.patched)} articles indexed; "
                     f"{len(todo)} conversations marked read")
        yield {"type": "done", "message": f"synthesis done — {len(plan.created)} created, "
               f"{len(plan.patched)} patched from {len(todo)} conversations",
               "created": plan.created, "patched": plan.patched}
        yield _summary(dry=False)

    def _create(self, plan: Plan, stems: list[str]) -> str:
        for stem in stems:
            topics = plan.topics[stem]
            text = articles.render(topics[0].title, topics[0].summary, _facts(topics), [])
            self.vault.write(stem, text, f"synthesis: create from {topics[0].source!r}")
            plan.created.append(stem)
        return f"{len(stems)} articles created"

    def _patch(self, plan: Plan, existing: set[str]) -> str:
        for stem in sorted(existing & set(plan.topics)):
            topics = plan.topics[stem]
            text = articles.add_bullets(self.vault.read(stem), articles.FACTS, _facts(topics))
            if self.vault.write(stem, text, f"synthesis: facts from {topics[0].source!r}"):
                plan.patched.append(stem)
        return f"{len(plan.patched)} existing articles gained facts"

    def _link(self, plan: Plan) -> str:
        added = 0
        for stem, topics in plan.topics.items():
            targets = {s for t in topics for s in map(articles.stem_of, t.related) if s}
            for stems in plan.by_conversation.values():
                if stem in stems:
                    targets |= stems
            targets.discard(stem)
            text = self.vault.read(stem)
            linked = articles.add_bullets(text, articles.SEE_ALSO,
                                          [f"[[{t}]]" for t in sorted(targets)])
            if linked != text:
                self.vault.write(stem, linked, "synthesis: see also")
                added += 1
        return f"{added} articles gained links"


def _facts(topics: list[Topic]) -> list[str]:
    return [f"{fact} (from “{t.source}”)" for t in topics for fact in t.facts]


def _stage(stage: str, message: str) -> dict:
    return {"type": "stage", "stage": stage, "message": message}


def _log(message: str) -> dict:
    return {"type": "log", "message": message}


def _summary(dry: bool) -> dict:
    note = ("dry run: ingest and segment ran; nothing was asked or written" if dry else
            "every stage ran: extraction by the served model under a JSON schema, articles "
            "and revisions on disk, the FTS5 index refreshed")
    return {"type": "summary", "implemented": True, "stages": STAGES, "note": note}
