"""The text filters that decide what may be streamed."""

import random

from mlxbun_core.engine.textstream import ReasoningSplitter, StopMatcher
from mlxbun_core.events import Content, Reasoning


def run_stop(chunks, stops):
    m = StopMatcher(stops)
    out = "".join(m.feed(c) for c in chunks)
    return out + ("" if m.stopped else m.flush()), m.stopped


def test_stop_sequence_never_emitted_in_any_chunking():
    text = "alpha beta ### gamma"
    rnd = random.Random(0)
    for _ in range(50):
        cuts = sorted(rnd.sample(range(1, len(text)), 5))
        chunks = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
        out, stopped = run_stop(chunks, ["###", "\n\n"])
        assert out == "alpha beta " and stopped == "###"


def test_partial_stop_prefix_is_held_then_released():
    m = StopMatcher(["STOP"])
    assert m.feed("abc ST") == "abc "
    assert m.feed("ar") == "STar"
    assert m.stopped is None


def test_earliest_stop_wins():
    out, stopped = run_stop(["x END y STOP"], ["STOP", "END"])
    assert out == "x " and stopped == "END"


def test_reasoning_split_across_chunk_boundaries():
    text = "<think>plan it</think>\n\nanswer"
    for size in (1, 2, 3, 5, 100):
        s = ReasoningSplitter("<think>", "</think>")
        parts = []
        for i in range(0, len(text), size):
            parts += s.feed(text[i:i + size])
        parts += s.flush()
        reasoning = "".join(e.text for e in parts if isinstance(e, Reasoning))
        content = "".join(e.text for e in parts if isinstance(e, Content))
        assert (reasoning, content) == ("plan it", "answer"), size


def test_prompt_opened_think_channel():
    s = ReasoningSplitter("<think>", "</think>", in_reasoning=True)
    parts = s.feed("hmm</think>ok") + s.flush()
    assert parts == [Reasoning("hmm"), Content("ok")]


def test_no_markers_means_all_content():
    s = ReasoningSplitter(None, None)
    assert s.feed("<think>x") == [Content("<think>x")]
