"""/v1/completions as evaluation tools use it (lm-evaluation-harness's local-completions):
``echo`` with ``logprobs`` scores the prompt from the prefill's forward pass, equal to
mlx-lm's own forward pass of the same tokens; ``logprobs`` as the legacy integer top-k;
prompts as lists of strings or token ids, each its own choices; the tokenizer routes;
and a clear 400 for each malformed shape. Real server on loopback, the official SDK and
raw HTTP, a tiny random checkpoint."""

from __future__ import annotations

import httpx
import pytest

from mlxbun_core.engine.lanes.pace import FixedChunk
from mlxbun_core.testing.checkpoints import tiny_checkpoint

PROMPT = "The sea was calm and the boats came home before the storm"


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("llama", seed=3)


@pytest.fixture(scope="module")
def reference(ckpt):
    """mlx-lm's own model: one forward pass over a whole token list → log-probs (float32)."""
    import mlx.core as mx
    from mlx_lm import load

    model, _ = load(str(ckpt))

    def forward(ids: list[int]) -> mx.array:
        logits = model(mx.array(ids)[None])[0].astype(mx.float32)
        return logits - mx.logsumexp(logits, axis=-1, keepdims=True)

    return forward


def complete(srv, **body) -> dict:
    r = httpx.post(srv.v1 + "/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def tokenize(srv, text: str) -> list[int]:
    r = httpx.post(srv.base_url + "/tokenize", json={"prompt": text}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def score(srv, prompt, k: int = 1) -> dict:
    """The echoed block of ``prompt`` with nothing generated."""
    return complete(srv, prompt=prompt, echo=True, logprobs=k, max_tokens=0)["choices"][0]


# -- echo with logprobs ------------------------------------------------------------

def test_prompt_logprobs_equal_mlx_lm_forward_pass(client, srv, reference):
    for lane in srv.engine.worker.lanes:  # several prefill chunks: the cache carries across
        lane.pacer = FixedChunk(4)
    r = client.completions.create(model="m", prompt=PROMPT, echo=True, logprobs=5, max_tokens=0)
    lp = r.choices[0].logprobs
    ids = tokenize(srv, PROMPT)
    assert len(lp.tokens) == len(ids) > 8 and r.choices[0].text == PROMPT
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    ref = reference(ids)
    for i in range(1, len(ids)):
        want = ref[i - 1]
        assert lp.token_logprobs[i] == pytest.approx(want[ids[i]].item(), abs=1e-4)
        best = sorted(want.tolist(), reverse=True)[:5]
        # the legacy dict is keyed by text (tokens that read alike merge): ids from content
        tops = lp.content[i]["top_logprobs"]
        assert [t["logprob"] for t in tops] == pytest.approx(best, abs=1e-4)
        assert max(lp.top_logprobs[i].values()) == tops[0]["logprob"]
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 0


def test_echo_with_generation_whole_and_streamed(client, srv):
    kw = dict(model="m", prompt=PROMPT, echo=True, logprobs=2, max_tokens=3, temperature=0)
    whole = client.completions.create(**kw).choices[0]
    n_prompt = len(tokenize(srv, PROMPT))
    lp = whole.logprobs
    assert whole.text.startswith(PROMPT) and len(lp.tokens) == n_prompt + 3
    # generated tokens follow the prompt's; text_offset indexes into the whole text
    generated = whole.text[len(PROMPT):]
    assert "".join(lp.tokens[n_prompt:]) == generated
    assert lp.text_offset[n_prompt] == len(PROMPT)
    for i in range(1, n_prompt):
        assert whole.text[lp.text_offset[i]:].startswith(lp.tokens[i])
    chunks = list(client.completions.create(stream=True, **kw))
    first = chunks[0].choices[0]
    assert first.text == PROMPT and first.logprobs.tokens == lp.tokens[:n_prompt]
    assert first.logprobs.token_logprobs == lp.token_logprobs[:n_prompt]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.text


def test_echo_without_logprobs_returns_the_prompt(client):
    r = client.completions.create(model="m", prompt="Once upon", echo=True, max_tokens=2,
                                  temperature=0)
    plain = client.completions.create(model="m", prompt="Once upon", max_tokens=2, temperature=0)
    assert r.choices[0].text == "Once upon" + plain.choices[0].text
    assert r.choices[0].logprobs is None
    assert client.completions.create(model="m", prompt="Once upon", echo=True,
                                     max_tokens=0).choices[0].text == "Once upon"


def test_multiple_choice_scoring_picks_the_likelier_continuation(srv, reference):
    """lm-eval's loglikelihood: sum token_logprobs[ctxlen:-1] of echo + max_tokens 1,
    and is_greedy from top_logprobs; the model's own greedy continuation must win."""
    import mlx.core as mx

    context = tokenize(srv, "The sea was")
    greedy = list(context)
    for _ in range(3):  # the model's most likely continuation, from mlx-lm directly
        greedy.append(int(mx.argmax(reference(greedy)[-1]).item()))
    unlikely = [*context, *[int(mx.argmin(reference(context)[-1]).item())] * 3]
    body = dict(prompt=[greedy, unlikely], echo=True, logprobs=1, max_tokens=1, temperature=0,
                seed=1234)
    out = complete(srv, **body)
    scores = []
    for choice in sorted(out["choices"], key=lambda c: c["index"]):
        lp = choice["logprobs"]
        values = lp["token_logprobs"][len(context):-1]
        tops = lp["top_logprobs"][len(context):-1]
        assert len(values) == 3
        scores.append((sum(values), all(v == max(t.values()) for v, t in zip(values, tops))))
    assert scores[0][0] > scores[1][0]
    assert scores[0][1] is True and scores[1][1] is False


# -- prompt shapes -----------------------------------------------------------------

def test_list_prompts_fan_out_in_openai_order(client, srv):
    prompts = ["Once upon", "The sea was calm"]
    r = client.completions.create(model="m", prompt=prompts, n=2, max_tokens=2, echo=True,
                                  temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for c in r.choices:
        assert c.text.startswith(prompts[c.index // 2])
    assert r.usage.prompt_tokens == sum(len(tokenize(srv, p)) for p in prompts)
    assert r.usage.completion_tokens == 8


def test_token_id_prompts_score_as_their_text(srv):
    ids = tokenize(srv, PROMPT)
    by_text = score(srv, PROMPT, k=3)["logprobs"]
    flat = score(srv, ids, k=3)
    nested = complete(srv, prompt=[ids, ids[:5]], echo=True, logprobs=3, max_tokens=0)
    assert flat["logprobs"]["tokens"] == by_text["tokens"]
    assert flat["logprobs"]["token_logprobs"][0] is None
    assert flat["logprobs"]["token_logprobs"][1:] == pytest.approx(by_text["token_logprobs"][1:])
    assert flat["text"] == httpx.post(srv.base_url + "/detokenize", json={"tokens": ids}
                                      ).json()["prompt"]
    a, b = sorted(nested["choices"], key=lambda c: c["index"])
    assert a["logprobs"]["tokens"] == flat["logprobs"]["tokens"]
    assert b["logprobs"]["token_logprobs"] == pytest.approx(
        flat["logprobs"]["token_logprobs"][:5])


def test_streamed_list_prompts_carry_each_choice_and_one_usage(client, srv):
    chunks = list(client.completions.create(model="m", prompt=["Once", "The sea"], max_tokens=2,
                                            stream=True, temperature=0))
    assert {c.choices[0].index for c in chunks if c.choices} == {0, 1}
    usage = [c.usage for c in chunks if c.usage is not None]
    assert usage[-1].prompt_tokens == len(tokenize(srv, "Once")) + len(tokenize(srv, "The sea"))


# -- tokenizer routes --------------------------------------------------------------

def test_tokenize_round_trip_in_both_spellings(srv):
    base = srv.base_url
    tok = srv.engine.model.tokenizer
    vllm = httpx.post(base + "/v1/tokenize", json={"prompt": PROMPT}).json()
    assert vllm["tokens"] == tok.encode(PROMPT) and vllm["count"] == len(vllm["tokens"])
    plain = httpx.post(base + "/tokenize", json={"prompt": PROMPT,
                                                 "add_special_tokens": False}).json()["tokens"]
    assert plain == tok.encode(PROMPT, add_special_tokens=False)
    llama = httpx.post(base + "/tokenize", json={"content": PROMPT, "with_pieces": True}).json()
    assert [t["id"] for t in llama["tokens"]] == plain
    assert "".join(t["piece"] for t in llama["tokens"]) == PROMPT
    for path in ("/detokenize", "/v1/detokenize"):
        back = httpx.post(base + path, json={"tokens": plain}).json()
        assert back["prompt"] == back["content"] == PROMPT


def test_tokenizer_info_gives_what_lm_eval_reads(srv):
    info = httpx.get(srv.base_url + "/tokenizer_info").json()
    tok = srv.engine.model.tokenizer
    assert info["eos_token"] == tok.eos_token and info["bos_token"] == tok.bos_token
    # lm-eval's RemoteTokenizer finds the EOS id by tokenizing its text
    eos = httpx.post(srv.base_url + "/tokenize", json={"prompt": info["eos_token"],
                                                       "add_special_tokens": False}).json()
    assert eos["tokens"][0] in tok.eos_token_ids
    assert info["chat_template"] == tok.chat_template
    assert httpx.get(srv.v1 + "/tokenizer_info").json() == info


# -- refusals ----------------------------------------------------------------------

@pytest.mark.parametrize("body, words", [
    ({"prompt": [1, 5000]}, "token id 5000 is outside the vocabulary"),
    ({"prompt": []}, "got an empty array"),
    ({"prompt": [[]]}, "prompt[0] must be a non-empty string or a non-empty array"),
    ({"prompt": ["a", 3]}, "prompt[1] must be"),
    ({"prompt": [[1, -2]]}, "prompt[0] must be"),
    ({"prompt": "x", "logprobs": 21}, "logprobs must be between 0 and 20"),
    ({"prompt": "x", "logprobs": -1}, "logprobs must be between 0 and 20"),
    ({"prompt": "x", "logprobs": "1"}, "logprobs must be a boolean or an integer"),
    ({"prompt": "x", "max_tokens": 0}, "0 is allowed with echo"),
    ({"prompt": "x", "echo": "yes"}, "echo must be a boolean"),
    ({"prompt": ["a"] * 40, "n": 2}, "more than 64 choices"),
    ({"prompt": [7] * 140_000, "max_tokens": 1}, "this server admits at most"),
])
def test_malformed_completions_are_400(srv, body, words):
    r = httpx.post(srv.v1 + "/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]
    assert complete(srv, prompt="after", max_tokens=1)["choices"][0]["finish_reason"]


@pytest.mark.parametrize("path, body, words", [
    ("/tokenize", {}, "prompt (vLLM) or content (llama.cpp)"),
    ("/tokenize", {"prompt": 3}, "prompt must be a string"),
    ("/detokenize", {"tokens": [1, 1 << 20]}, "outside the vocabulary"),
    ("/detokenize", {"tokens": "1 2"}, "tokens must be an array of token ids"),
    ("/v1/detokenize", {"tokens": [True]}, "tokens[0] must be an integer"),
])
def test_malformed_tokenizer_calls_are_400(srv, path, body, words):
    r = httpx.post(srv.base_url + path, json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]


def test_text_starting_with_bos_gets_no_second_one(srv):
    """lm-eval with tokenized_requests off and add_bos_token sends the BOS as text."""
    tok = srv.engine.model.tokenizer
    ids = tokenize(srv, PROMPT)
    assert ids[0] == tok.bos_token_id  # this tokenizer adds a BOS
    again = score(srv, tok.bos_token + PROMPT)["logprobs"]
    assert again["tokens"] == score(srv, PROMPT)["logprobs"]["tokens"]
    assert tokenize(srv, tok.bos_token + PROMPT) == ids
