"""MTP batch rows draft only while their drafts land (``speculate/gate.py``, the gate the
lookup streams and the serial MTP stream use): a row whose head never guesses right
decodes like a plain row after its first round (no windows, and a head call only at the
gate's spaced free checks), a row whose drafts land drafts every step, and a row that
went cold drafts again once its head's guesses come true. Greedy tokens equal mlx-lm's
plain decode either way, and a request's ``usage.speculation`` shows the gate (drafts
stop, target calls go on), as the serial lane's does.

The executor runs without a server here (``testing.mtp.BatchRun``: the batch lane's
engine and tap) on the tiny Qwen3.5 (gated DeltaNet beside attention: rejected rows are
restored and fed again); the ``"random"`` head almost never lands, the ``"copy"`` head
(proposes the token it was given) lands on a prompt the tiny model answers with one
token repeated.
"""

from __future__ import annotations

from collections import Counter

import httpx
import openai
import pytest

from mlxbun_core import loader
from mlxbun_core.engine.speculate import server_config
from mlxbun_core.engine.speculate.gate import LandingGate
from mlxbun_core.engine.speculate.mtp_batch import PROBE_BACKOFF
from mlxbun_core.model import LoadOptions
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import configure, mlx_lm_greedy, together
from mlxbun_core.testing.mtp import BatchRun
from mlxbun_core.testing.server import start_server

BUDGET = 64
LANDS = [749] * 6  # the tiny model answers 749 forever: the copy head's drafts all land
LATE = [938] * 6  # varied at first (the copy head misses), a repeat near the end


def loaded(head: str):
    out = loader.load(str(tiny_checkpoint("qwen3_5", mtp=head, dtype="float32")),
                      LoadOptions())
    return out.model, out.hooks.token_predictor(model=out)


class Counted(BatchRun):
    """A :class:`BatchRun` that records, per decode step, each MTP row's drafts, whether
    the step fed windows (drafts or refed tokens) or was a plain pipelined one, and each
    row's head calls."""

    def __init__(self, *args):
        super().__init__(*args)
        self.drafted: list[dict[int, int]] = []
        self.windowed: list[bool] = []
        self.heads: list[Counter[int]] = []  # head calls per row, made for each step
        drafts, pages = self.mtp.drafts, self.mtp.pages
        append = pages.append

        def recorded(batch):
            self.heads.append(Counter())
            out = drafts(batch)
            self.drafted.append({u: len(d) for u, d in out.items()})
            self.windowed.append(bool(out) or any(batch.rows[u].refeed
                                                  for u in batch.decoding))
            return out

        def counted(uids, *args, **kw):
            if self.heads:
                self.heads[-1].update(uids)
            return append(uids, *args, **kw)

        self.mtp.drafts = recorded
        pages.append = counted

    def draft_steps(self, uid: int, since: int = 0) -> int:
        return sum(bool(d.get(uid)) for d in self.drafted[since:])


def assert_plain_tokens(model, run: BatchRun) -> None:
    for i, (_, prompt, budget, _) in enumerate(run.rows):
        assert run.out[i] == mlx_lm_greedy(model, prompt, budget, ()), i
    assert run.batch.pool.used == 0 and run.mtp.pages.pool.used == 0


def test_rows_whose_drafts_never_land_decode_as_plain_rows():
    """Random head: after the first round (the gate starts open) no MTP row drafts again,
    past the gate's window every step is a plain pipelined one, each row takes one target
    pass per token (as plain decoding) and its head runs at most one step in six (the
    gate's checks, one in eight)."""
    model, predictor = loaded("random")
    prompts = [[5, 77, 301, 12, 9], [938] * 6, [826] * 6]
    rows = [(0, p, BUDGET, 2) for p in prompts] + [(1, [280] * 6, BUDGET, None)]
    run = Counted(model, predictor, rows).run()
    assert_plain_tokens(model, run)
    window = 16  # steps for the first round, its refeed and the first checks
    assert not any(run.windowed[window:])
    for uid in range(3):
        spec = run.usage[uid].speculation
        assert spec["accepted"] == 0 and run.draft_steps(uid) == 1, uid
        assert run.calls[uid] == 1 + BUDGET  # one target pass per token, as plain
        tail = [h[uid] for h in run.heads[window:run.calls[uid]]]
        assert sum(map(bool, tail)) <= len(tail) / 6, (uid, tail)  # (drafting: every step)


def test_rows_whose_drafts_land_keep_drafting_and_a_cold_row_opens_again():
    """Copy head: the row the tiny model answers with one repeated token drafts at every
    step it takes and keeps every draft (a third of plain's target passes); a row whose
    first drafts miss goes cold, and drafts again (and keeps drafts) once its tokens
    start repeating, found by the gate's free checks; a plain row beside them. Greedy
    tokens equal mlx-lm's."""
    model, predictor = loaded("copy")
    rows = [(0, LANDS, 48, 2), (0, LATE, 48, 2), (2, [826] * 6, 48, None)]
    run = Counted(model, predictor, rows).run()
    assert_plain_tokens(model, run)
    lands, late = run.usage[0].speculation, run.usage[1].speculation
    assert lands["accepted"] == lands["drafted"] > 0
    assert run.draft_steps(0) == run.calls[0] - 1  # every step but the prompt's last
    assert run.calls[0] == 1 + 48 - lands["accepted"] <= 1 + 48 // 3 + 1
    cold = next(s for s, d in enumerate(run.drafted) if 1 not in d and s > 1)
    assert run.draft_steps(1, since=cold) > 0 and late["accepted"] > 0
    assert run.calls[1] == 1 + 48 - late["accepted"]


def test_the_gate_off_drafts_every_step(monkeypatch):
    """``MLXBUN_SPEC_BATCH_GATE=0``: a row whose drafts never land drafts every step it can
    (every other one on the CPU: a rejected row feeds its kept tokens first), the old
    behaviour the gate replaces."""
    configure(monkeypatch, speculation={"batch_gate": False})
    model, predictor = loaded("random")
    run = Counted(model, predictor, [(0, [938] * 6, 32, 2), (0, [5, 6, 7], 32, None)]).run()
    assert_plain_tokens(model, run)
    assert run.draft_steps(0) >= 32 // 2 - 1 and run.usage[0].speculation["accepted"] == 0


def test_a_cold_gate_checks_less_often_after_each_miss():
    """The free checks' schedule on the batch's step count: a gate whose guesses never
    come true checks at once, then every 2nd, 4th and ``PROBE_BACKOFF``th step (cold rows
    at the same period check together); a hit makes it check the next step (a miss
    then puts it back on its period), two in a row open it; a round that keeps nothing
    closes it and it checks at once."""
    gate = LandingGate(hot=False, backoff=PROBE_BACKOFF)
    checks = []
    for step in range(1, 40):
        if gate.due(step):
            checks.append(step)
            gate.checked(False)
    assert checks == [1, 2, 4, 8, 16, 24, 32]
    assert not gate.due(33) and gate.due(40)
    gate.checked(True)
    assert gate.due(41) and not gate.hot
    gate.checked(False)  # a lone hit: back to the period it had
    assert not gate.due(42) and gate.due(48)
    gate.checked(True)
    assert gate.due(49)
    gate.checked(True)
    assert gate.hot and gate.due(51)
    gate.landed(0)
    assert not gate.hot and gate.due(53)
    assert LandingGate().due(3)  # lookup: every step


@pytest.fixture(scope="module")
def srv():
    s = start_server(tiny_checkpoint("qwen3_5", mtp="random", dtype="float32"),
                     speculation=server_config("mtp"), batch=8)
    yield s
    s.stop()


def test_usage_shows_the_gate_on_the_batch_lane(srv):
    """Concurrent MTP requests with a random head on the batch lane (beside a long plain
    stream, so no MTP row ever decodes alone): each reply's ``usage.speculation`` counts
    one round of drafts (none kept) and a target call per token; the replies equal the
    same prompts decoded with ``draft_kind`` "none"; ``/stats`` counts as few batch steps
    with drafts."""
    oai = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0, timeout=120)
    prompts = ["hello there how are you", "the sea", "one two three four five six seven"]

    def complete(prompt: str, kind: str):
        return oai.completions.create(model="m", prompt=prompt, max_tokens=BUDGET,
                                      temperature=0, extra_body={"draft_kind": kind})

    before = httpx.get(srv.base_url + "/stats").json()["speculation"]
    company = oai.completions.create(model="m", prompt="Tell me about the mountains",
                                     max_tokens=4 * BUDGET, temperature=0, stream=True,
                                     extra_body={"draft_kind": "none"})
    next(iter(company))  # it is decoding in the batch
    spec = together(*[lambda p=p: complete(p, "mtp") for p in prompts])
    for _ in company:
        pass
    plain = together(*[lambda p=p: complete(p, "none") for p in prompts])
    assert [r.choices[0].text for r in spec] == [r.choices[0].text for r in plain]
    for r in spec:
        usage = r.usage.model_extra
        assert usage["lane"] == "batched+spec"
        counts = usage["speculation"]
        assert counts["accepted"] == 0 and 0 < counts["drafted"] <= 4, counts
        assert counts["targetCalls"] >= r.usage.completion_tokens
    stats = httpx.get(srv.base_url + "/stats").json()["speculation"]
    assert 0 < stats["batch_steps"] - before["batch_steps"] <= 2 * len(prompts)


def lone(head: str, prompt: list[int], budget: int, depth: int = 2):
    """A lone MTP stream (the serial lane's, and a lone request's on a batch engine) on
    the tiny Qwen3.5 with ``head``: its greedy tokens, its usage, and which rounds drafted."""
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    from mlxbun_core.engine.speculate import MtpStream

    model, predictor = loaded(head)
    usage = {"drafted": 0, "accepted": 0, "targetCalls": 0}
    stream = MtpStream(predictor, make_prompt_cache(model), [], depth, make_sampler(0.0),
                       [], usage)
    stream.read(prompt[:-1], prompt[-1])
    stream.begin(prompt[-1])
    out: list[int] = []
    drafted: list[int] = []  # drafts sent per round, in order (the first: the prompt's
    # last token, fed with none)
    while len(out) < budget:
        before = usage["drafted"]
        out += [t for t, _ in stream.step()]
        drafted.append(usage["drafted"] - before)
    stream.settle()
    assert out[:budget] == mlx_lm_greedy(model, prompt, budget, ())
    return usage, drafted


def test_a_lone_stream_whose_drafts_never_land_stops_drafting():
    """Random head: the first round drafts (the gate starts open), keeps nothing and
    closes the gate; the head's free checks never come true twice in a row, so no round
    drafts again and the stream takes one target pass per token, as plain decoding."""
    usage, drafted = lone("random", [938] * 6, BUDGET)
    assert usage["accepted"] == 0 and usage["drafted"] == 2, (usage, drafted)
    assert drafted[:2] == [0, 2] and not any(drafted[2:])
    assert usage["targetCalls"] == 1 + BUDGET  # the prompt's last token, then one a token


def test_a_lone_stream_whose_drafts_land_keeps_drafting():
    """Copy head on a prompt the tiny model answers with one token repeated: every round
    drafts and keeps its drafts (a third of plain's target passes)."""
    usage, drafted = lone("copy", LANDS, 48)
    assert all(d == 2 for d in drafted[1:]) and usage["accepted"] == usage["drafted"] > 0
    assert usage["targetCalls"] <= 1 + 48 // 3 + 1


def test_a_lone_stream_with_the_gate_off_drafts_every_round(monkeypatch):
    """``MLXBUN_SPEC_BATCH_GATE=0`` also switches the lone stream's gate off: the random
    head's drafts ride every round though none lands."""
    configure(monkeypatch, speculation={"batch_gate": False})
    usage, drafted = lone("random", [938] * 6, 32)
    assert usage["accepted"] == 0 and all(drafted[1:])
    assert usage["drafted"] == 2 * (len(drafted) - 1)


def test_usage_shows_the_gate_on_a_lone_request(srv):
    """A lone MTP request on the batch engine (its solo lane): ``usage.speculation``
    counts one round of drafts (none kept) and a target call per token; the reply equals
    the prompt decoded with ``draft_kind`` "none"."""
    oai = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0, timeout=120)

    def complete(kind: str):
        return oai.completions.create(model="m", prompt="the sea and the sky", temperature=0,
                                      max_tokens=BUDGET, extra_body={"draft_kind": kind})

    spec, plain = complete("mtp"), complete("none")
    assert spec.choices[0].text == plain.choices[0].text
    usage = spec.usage.model_extra
    counts = usage["speculation"]
    assert counts["accepted"] == 0 and 0 < counts["drafted"] <= 4, (usage, counts)
    assert counts["targetCalls"] >= spec.usage.completion_tokens
    assert counts["targetCalls"] <= spec.usage.completion_tokens + 2
