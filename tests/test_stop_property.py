"""Property tests of the stop-sequence filter: whatever the chunking, the text that
streams out is the text before the first stop to complete, and nothing is lost."""

from hypothesis import given, settings
from hypothesis import strategies as st

from mlxbun_core.engine.textstream import StopMatcher

# a small alphabet makes stops (and near-misses) common in random text
TEXT = st.text(alphabet="abc\n", max_size=40)
STOPS = st.lists(st.text(alphabet="abc\n", min_size=1, max_size=4), min_size=1, max_size=3)
SETTINGS = settings(max_examples=250, deadline=None, derandomize=True, database=None)


def expected(text: str, stops: list[str]):
    """(emitted text, stop) for a generator that stops as soon as a stop sequence completes:
    the earliest END wins; among stops ending there, the earliest start (nothing of a
    completed stop is ever emitted). With one stop this is ``text.split(stop)[0]``."""
    best = None
    for s in stops:
        i = text.find(s)
        if i >= 0:
            key = (i + len(s), i)
            if best is None or key < best[0]:
                best = (key, s)
    if best is None:
        return text, None
    return text[:best[0][1]], best[1]


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0] + points, points + [len(text)])]


def stream(chunks, stops):
    m = StopMatcher(stops)
    out = "".join(m.feed(c) for c in chunks)
    return out + m.flush(), m.stopped


@SETTINGS
@given(TEXT, st.text(alphabet="abc\n", min_size=1, max_size=4), st.lists(st.integers(0, 40)))
def test_one_stop_is_split(text, stop, cuts):
    out, stopped = stream(chunked(text, cuts), [stop])
    assert out == text.split(stop)[0]
    assert stopped == (stop if stop in text else None)


@SETTINGS
@given(TEXT, STOPS, st.lists(st.integers(0, 40)))
def test_several_stops_any_chunking(text, stops, cuts):
    out, stopped = stream(chunked(text, cuts), stops)
    want, want_stop = expected(text, stops)
    assert out == want
    assert stopped == want_stop


@SETTINGS
@given(TEXT, STOPS, st.lists(st.integers(0, 40)))
def test_streamed_prefix_is_never_retracted(text, stops, cuts):
    """Each feed only returns text the final answer keeps (nothing must be taken back)."""
    want, _ = expected(text, stops)
    m, sent = StopMatcher(stops), ""
    for c in chunked(text, cuts):
        sent += m.feed(c)
        assert want.startswith(sent)


@SETTINGS
@given(TEXT, STOPS)
def test_end_of_stream_mid_hold_flushes_the_held_text(text, stops):
    """Generation ends (EOS, length) while a stop's prefix is held back: it is released."""
    stop = stops[0]
    tail = stop[:-1]
    body = expected(text, stops)[0]
    m = StopMatcher(stops)
    # the body never completes a stop; its tail may be a partial stop held back
    out = m.feed(body) + m.feed(tail)
    want, _ = expected(body + tail, stops)
    assert out + (m.flush() if m.stopped is None else "") == want


# -- the same property through GenerationSession, on a real tokenizer's pieces ----

def _session_tokenizer():
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from mlxbun_core.testing.checkpoints import tiny_checkpoint

    return load_tokenizer(tiny_checkpoint("qwen3"))


TOK = _session_tokenizer()
WORDS = st.lists(st.sampled_from(["ab", "a", "b", "c", " ", "\n", "abc", "ca"]),
                 max_size=12).map("".join)


def session_text(text, stops, *, by_length: bool):
    """Feed ``text``'s tokens, then EOS (or hit the token limit); return (content, finish)."""
    from mlxbun_core.engine.sampling import SamplingParams
    from mlxbun_core.engine.session import GenerationRequest, GenerationSession

    ids = TOK.encode(text, add_special_tokens=False)
    limit = len(ids) if by_length and ids else None
    sess = GenerationSession(GenerationRequest(prompt_tokens=[1], sampling=SamplingParams(),
                                               stop=stops), TOK, limit)
    events = []
    for t in ids + [min(TOK.eos_token_ids)]:
        events += sess.step(t, None)
        if sess.finished is not None:
            break
    content = "".join(ev.text for ev in events if ev.kind == "content")
    return content, sess.finished


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(WORDS, STOPS, st.booleans())
def test_session_stops_where_the_text_says(text, stops, by_length):
    content, fin = session_text(text, stops, by_length=by_length)
    detok = TOK.detokenizer  # the text the model "said" is mlx-lm's own detokenization
    detok.reset()
    for t in TOK.encode(text, add_special_tokens=False):
        detok.add_token(t)
    detok.finalize()
    want, want_stop = expected(detok.text, stops)
    assert content == want
    assert fin.stop_sequence == want_stop
    if want_stop is not None:
        assert fin.reason == "stop"
    else:  # the end came (EOS or the limit) with a stop's prefix possibly held: all of it out
        assert fin.reason == ("length" if by_length and text else "stop")
