"""Jobs are data: what to run, where its events go, and whether it was cancelled.

Lanes (``engine/lanes/``) run generation jobs; the worker runs call jobs between
lane steps. Nothing here touches MLX, so jobs are cheap to make on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..adapters.sets import NO_ADAPTERS, AdapterSet
from ..contract import DraftSource, Tokenizer
from ..events import KEEPALIVE, Admitted, Done, Event, Retry
from .cache_explain import OFF
from .session import GenerationRequest, GenerationSession

if TYPE_CHECKING:
    import mlx.core as mx

    from .fill.forced import FillSession
    from .speculate import SpecConfig, SpecTally

_ids = itertools.count(1)


class _Courier:
    """Carries event batches of many requests to one event loop in a single wake-up.

    The worker posts for every row of a batch each step; the first post of a burst
    schedules one delivery on the loop, later posts of the same burst ride along.
    Inside :func:`posts_held` the first post waits for the hold's end to schedule it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[asyncio.Queue[list[Event]], list[Event]]] = []

    def post(self, q: asyncio.Queue[list[Event]], events: list[Event]) -> None:
        with self._lock:
            first = not self._pending
            self._pending.append((q, events))
        if first:
            held: dict[_Courier, None] | None = getattr(_holding, "couriers", None)
            if held is not None:
                held[self] = None
            else:
                self.wake()

    def wake(self) -> None:
        """Schedule the delivery of what is pending on the loop."""
        try:
            self.loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            with self._lock:
                self._pending.clear()

    def _deliver(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        for q, events in batch:
            q.put_nowait(events)


_holding = threading.local()  # ``couriers``: those a hold on this thread will wake


@contextlib.contextmanager
def posts_held() -> Iterator[None]:
    """Events posted inside reach their loops together, in one wake-up each, when it
    ends: a decode step hands out a token per row, and a wake-up at the first row's
    woke the event loop (its thread took the GIL at the wake-up's write) while the
    worker still had the other rows to deliver."""
    if getattr(_holding, "couriers", None) is not None:  # (an outer hold wakes them)
        yield
        return
    _holding.couriers = {}
    try:
        yield
    finally:
        couriers, _holding.couriers = _holding.couriers, None
        for courier in couriers:
            courier.wake()


_couriers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Courier] = \
    weakref.WeakKeyDictionary()


class EventSink:
    """Hands event batches from the worker thread to one request's asyncio queue."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.queue: asyncio.Queue[list[Event]] = asyncio.Queue()
        self._held: list[Event] = []  # read ahead, not yet taken by :meth:`get`
        courier = _couriers.get(loop)
        if courier is None:
            courier = _couriers[loop] = _Courier(loop)
        self._courier = courier

    def post(self, events: list[Event]) -> None:
        if events:
            self._courier.post(self.queue, events)

    async def get(self, idle: float | None = None) -> list[Event]:
        """The next batch of events (on the loop): those read ahead first; with ``idle``,
        a KeepAlive when none came for ``idle`` seconds. The wait's timer is a plain
        loop timer, not a task per wait: a stream waits once per decode step, and 32 of
        them each step made the event loop thread hold the GIL as long as the worker."""
        if self._held:
            batch, self._held = self._held, []
            return batch
        if idle is None or not self.queue.empty():
            return await self.queue.get()
        timer = asyncio.get_running_loop().call_later(idle, self._keepalive)
        try:
            return await self.queue.get()
        finally:
            timer.cancel()

    def _keepalive(self) -> None:
        if self.queue.empty():  # (events that came just now make it needless)
            self.queue.put_nowait([KEEPALIVE])

    async def read_ahead(self) -> list[Event]:
        """Read (and keep for :meth:`get`) until the job is admitted or has ended; the
        events kept."""
        while not any(isinstance(ev, (Admitted, Done)) for ev in self._held):
            self._held += await self.queue.get()
        return self._held


class Job:
    """Something for the worker thread; ``cancelled`` is set from any thread."""

    def __init__(self) -> None:
        self.id = next(_ids)
        self.cancelled = threading.Event()
        self.submitted = time.perf_counter()

    def cancel(self) -> None:
        self.cancelled.set()


class CallJob(Job):
    """Run ``fn`` on the worker thread between decode steps (embeddings, mounting)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None, fn: Callable[[], Any]):
        super().__init__()
        self.loop, self.fn = loop, fn
        self.future: asyncio.Future[Any] | None = loop.create_future() if loop else None
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # reported to the caller, never kills the worker
            self.error = exc
        self.done.set()
        if self.future is not None:
            assert self.loop is not None  # a future needs its loop
            self.loop.call_soon_threadsafe(_settle, self.future, self.result, self.error)


def _settle(fut: asyncio.Future[Any], value: object, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


def may_speculate(request: GenerationRequest, draft: DraftSource | None) -> bool:
    """Whether a request's speculation runs: media and prompt embeddings take their own
    forward, and a draft model decides alone (admission bills an MTP row's head only
    then); a scored prompt reads its prefill through the scorer. A grammar's drafts are
    checked and taken back through its matcher (``GrammarProcessor.draft_prefix``)."""
    grammar = request.grammar
    return ((grammar is None or hasattr(grammar, "draft_prefix")) and request.media is None
            and request.input_embeddings is None and draft is None
            and not request.score_prompt)


class GenerationJob(Job):
    """One request's generation: the prepared request, its text session, its sink.

    ``limit`` is the completion budget after admission (None: until EOS).
    ``draft`` is a mounted draft source (speculative decoding) or None; ``spec`` the
    prompt-lookup settings the request decodes with (None: plain decoding), ``spec_tally``
    the engine's counters they add to.
    ``adapters`` is the resolved LoRA :class:`~mlxbun_core.adapters.AdapterSet` (empty:
    the base model); lanes activate it before stepping the job.
    Lanes set ``started`` when the job leaves the waiting queue.
    """

    def __init__(self, request: GenerationRequest, tokenizer: Tokenizer, sink: EventSink,
                 limit: int | None, draft: DraftSource | None = None,
                 cache_namespace: Hashable | None = None, adapters: AdapterSet | None = None,
                 spec: SpecConfig | None = None, spec_tally: SpecTally | None = None):
        super().__init__()
        self.adapters = adapters if adapters is not None else NO_ADAPTERS
        # prefix-cache key space (model, adapter, KV settings, media); None: never cached
        self.cache_namespace = cache_namespace
        self.request = request
        self.limit = limit
        # a grammar matcher cannot rewind rejected drafts: constrained requests decode
        # plainly; media requests run their pipeline's own forward pass
        self.draft = draft if request.grammar is None and request.media is None else None
        self.spec = spec if may_speculate(request, self.draft) else None
        self.spec_tally = spec_tally
        self.session = GenerationSession(request, tokenizer, limit)
        self.sink = sink
        self.started: float | None = None
        self.reserved_bytes = 0  # KV held against the memory budget while it runs
        self.reserved_head = False  # and the MTP head's weights with it (it drafts with the head)
        # forced-token fill (engine/fill/): set by the engine when the request may fill
        self.fill: FillSession | None = None
        # the X-Mlxbun-Cache header's value, set at admission (None: not admitted yet)
        self.cache_note: str | None = None
        # every token handed to the session (sampled and forced), in order: a preempted
        # job is recomputed from its prompt and these (lanes/pressure.py)
        self.output: list[int] = []
        self.preempted = False  # its KV was dropped; it waits in its lane to be recomputed
        # since when it waits for memory (None: it does not), and how much output it had
        # when first preempted: a job preempted again without progress keeps its clock
        self.waiting_since: float | None = None
        self.progress_mark = 0
        # tokens its first pass over no KV kept (0: unknown): under a KV scheme they
        # attended in full precision, and its recomputed row reads as many first
        self.first_pass = 0
        # a resumed generation (gen_checkpoint.py): tokens its prompt carries from a
        # snapshot, already handed out; ``on_emit`` sees (and may extend) every batch of
        # events before it is posted
        self.replayed = 0
        self.on_emit: Callable[[list[Event]], list[Event]] | None = None
        self.keep_kv_on_cancel = False  # a cancelled row publishes its KV (a resume reads it)

    def mark_started(self, lane: str) -> None:
        """The job leaves the waiting queue and starts on ``lane``."""
        self.started = time.perf_counter()
        self.session.phases["admission_wait_s"] = self.started - self.submitted
        self.session.usage.lane = lane

    def admitted(self, cached_tokens: int = 0, cache_note: str | None = None) -> None:
        """Report the prompt's cache hit (known once the lane has looked it up) and
        ``cache_note``, why it is that long (None: the cache was not looked up)."""
        self.cache_note = cache_note or OFF
        usage = self.session.usage
        usage.cached_tokens = cached_tokens
        self.emit([Admitted(cached_tokens, usage.lane)])

    @property
    def finished(self) -> bool:
        return self.session.finished is not None

    def emit(self, events: list[Event]) -> None:
        if self.on_emit is not None:
            events = self.on_emit(events)
        self.sink.post(events)

    def deliver(self, token: int, logprobs: mx.array | None,
                forced: Sequence[int] = ()) -> None:
        """One sampled token, then the ``forced`` run the lane fed after it (fill):
        through the text session, their events to the client. A grammar that is
        complete after them ends the job here (only EOS could follow)."""
        events = self.session.step(token, logprobs)
        self.output.append(token)
        for t in forced:
            if self.finished:
                break
            events += self.session.step(t, None)
            self.output.append(t)
        grammar = self.request.grammar
        if not self.finished and grammar is not None and grammar.done:
            events += self.session.finish("stop")
        self.emit(events)

    def close(self, reason: str, error: str | None = None, retry: Retry | None = None) -> None:
        """End the job now (cancelled, failed): flush and post ``Done``; idempotent
        (``retry``: the client may send it again later, see :class:`Retry`)."""
        self.emit(self.session.finish(reason, error=error, retry=retry))
