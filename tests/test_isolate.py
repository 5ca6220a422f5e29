"""`serve --isolate --model-pool 2`: a real parent process, real engine children on unix
sockets, official SDKs as clients. Model switching by the `model` field, LRU eviction,
SIGKILL of an engine, disconnects through the proxy, and the parent-owned Responses store."""

import json
import os
import signal
import threading
import time

import anthropic
import httpx
import mlx.core as mx
import openai
import pytest
import websockets.sync.client
from mlx_lm import load as mlx_load
from mlx_lm.generate import generate_step
from prometheus_client.parser import text_string_to_metric_families

from mlxbun_core.isolate import access
from mlxbun_core.testing.hub_cache import library_env, library_hub
from mlxbun_core.testing.process import serve

LLAMA, GEMMA, QWEN = "acme/Tiny-Llama-Chat", "acme/Tiny-Gemma4-it", "other/Qwen3-Tiny"
PROMPT = "Once upon a time"


class Parent:
    def __init__(self, server):
        self.server, self.proc, self.base = server, server.proc, server.base
        self.client = openai.OpenAI(base_url=self.base + "/v1", api_key="unused",
                                    max_retries=0, timeout=120)

    def get(self, path, **kw):
        return httpx.get(self.base + path, timeout=kw.pop("timeout", 30), **kw)

    def engine(self):
        return self.get("/engine").json()

    def resident(self):
        return {e["model"]: e for e in self.engine()["pool"]["resident"]}

    def wait(self, cond, what, timeout=120):
        self.server.wait_until(cond, what, timeout)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("iso")
    return root, library_hub(root / "hf" / "hub")


@pytest.fixture(scope="module")
def parent(hub):
    with serve("--isolate", "--model-pool", "2", "Tiny-Llama", env=library_env(hub[0]),
               ready="/engine", timeout=120) as server:
        yield Parent(server)


@pytest.fixture(scope="module")
def reference(hub):
    """Greedy token ids and EOS ids of each checkpoint, straight from mlx-lm."""
    out = {}
    for repo in (LLAMA, GEMMA, QWEN):
        model, tok = mlx_load(str(hub[1][repo]))
        ids = []
        for t, _ in generate_step(mx.array(tok.encode(PROMPT)), model, max_tokens=8):
            ids.append(int(t))
            if t in tok.eos_token_ids:
                break
        out[repo] = (ids, sorted(tok.eos_token_ids))
    return out


def greedy(parent, model):
    r = parent.client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                                         extra_body={"logprobs": True})
    return r.model, [e["id"] for e in r.choices[0].logprobs.content]


def long_body(eos_ids, **kw):
    return {"prompt": "Once", "max_tokens": 100000, "temperature": 1.0,
            "logit_bias": {str(i): -100 for i in eos_ids}, **kw}


def test_parent_answers_models_engine_and_hides_drain(parent):
    data = parent.client.models.list().data
    assert data[0].id == LLAMA and data[0].capabilities["chat_completions"]
    assert {m.id: m.tier for m in data[1:]} == {GEMMA: "targeted", QWEN: "generic"}
    e = parent.engine()
    assert e["isolated"] is True and isinstance(e["pid"], int) and e["restarts"] == 0
    assert e["socket"].endswith(".sock") and e["pool"]["cap"] == 2 and e["pool"]["default"] == LLAMA
    assert httpx.post(parent.base + "/admin/drain").status_code == 404
    assert parent.get("/ws/chat").status_code == 501
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        websockets.sync.client.connect(parent.base.replace("http", "ws") + "/ws/chat").close()
    assert refused.value.response.status_code == 501
    assert parent.get("/health").json() == {"status": "ok"}
    chat = parent.get("/v1").json()["web_chat"]  # what the page asks before it opens a socket
    assert chat["available"] is False and "--isolate" in chat["reason"]


def test_requests_alternate_between_models(parent, reference):
    for model in (LLAMA, GEMMA, LLAMA, GEMMA, "gpt-4"):  # an unknown id rides the default
        served, ids = greedy(parent, model)
        expect = LLAMA if model == "gpt-4" else model
        assert served == expect and ids == reference[expect][0]
    assert set(parent.resident()) == {LLAMA, GEMMA}
    claude = anthropic.Anthropic(base_url=parent.base, api_key="unused", max_retries=0)
    msg = claude.messages.create(model=GEMMA, max_tokens=4,
                                 messages=[{"role": "user", "content": "Hi"}])
    assert msg.model == GEMMA and msg.usage.output_tokens >= 1


def scrape(parent) -> dict:
    """The parent's /metrics: (sample name, labels) -> value; every sample once."""
    r = parent.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"duplicate sample {key}"
            out[key] = s.value
    return out


def test_metrics_merge_every_engine_with_its_model_label(parent):
    """Run after the alternation above: both models are resident."""
    def moved(name, **labels):
        key = (name, frozenset(labels.items()))
        return after.get(key, 0.0) - before.get(key, 0.0)

    before = scrape(parent)
    usage = {m: parent.client.completions.create(model=m, prompt=PROMPT, max_tokens=3).usage
             for m in (LLAMA, GEMMA)}
    assert parent.get("/v1/models/no-such-id").status_code == 404  # the parent answers it
    after = scrape(parent)
    for model, u in usage.items():
        assert moved("mlxbun_completion_tokens_total", model=model) == u.completion_tokens > 0
        assert moved("mlxbun_prompt_tokens_total", model=model) == u.prompt_tokens
        assert moved("mlxbun_time_to_first_token_seconds_count", model=model) == 1
        assert moved("mlxbun_http_requests_total", route="/v1/completions", method="POST",
                     status="200", model=model) == 1  # counted once, by its engine
        assert after[("mlxbun_engine_up", frozenset({("model", model)}))] == 1
        assert after[("mlxbun_memory_budget_bytes", frozenset({("model", model)}))] > 0
    assert moved("mlxbun_http_requests_total", route="/v1/models/*", method="GET",
                 status="404") == 1  # the parent's own answer, no model label
    assert after[("mlxbun_pool_engines_max", frozenset())] == 2


def test_third_model_evicts_the_least_recently_used(parent, reference):
    greedy(parent, GEMMA)
    greedy(parent, LLAMA)  # GEMMA is now the least recently used
    gemma_pid = parent.resident()[GEMMA]["pid"]
    served, ids = greedy(parent, QWEN)
    assert served == QWEN and ids == reference[QWEN][0]
    assert set(parent.resident()) == {LLAMA, QWEN} and parent.engine()["pool"]["evictions"] == 1
    parent.wait(lambda: _gone(gemma_pid), "the evicted engine to exit", timeout=30)


def _gone(pid) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_sigkill_costs_one_request_and_nothing_else(parent, reference):
    first = parent.client.responses.create(model=LLAMA, input="Remember me.", max_output_tokens=4)
    health, stop = [], threading.Event()

    def poll_health():
        while not stop.is_set():
            try:
                health.append(parent.get("/health", timeout=5).status_code)
            except httpx.HTTPError as exc:
                health.append(repr(exc))
            time.sleep(0.05)

    poller = threading.Thread(target=poll_health)
    poller.start()
    try:
        before = parent.resident()[LLAMA]
        result = {}

        def in_flight():
            result["r"] = httpx.post(parent.base + "/v1/completions",
                                     json=long_body(reference[LLAMA][1]), timeout=120)

        def streaming():
            with httpx.stream("POST", parent.base + "/v1/completions", timeout=120,
                              json=long_body(reference[LLAMA][1], stream=True)) as r:
                result["stream"] = list(r.iter_lines())

        threads = [threading.Thread(target=in_flight), threading.Thread(target=streaming)]
        for t in threads:
            t.start()
        parent.wait(lambda: parent.resident()[LLAMA]["in_flight"] == 2, "two requests in flight")
        time.sleep(0.5)
        os.kill(before["pid"], signal.SIGKILL)
        for t in threads:
            t.join(60)
        r = result["r"]
        assert r.status_code == 502 and r.json()["error"]["type"] == "engine_unavailable"
        lines = result["stream"]  # a stream under way ends with an error event
        tail = [ln for ln in lines if ln][-2:]
        assert tail[0] == "event: error" and '"engine_unavailable"' in tail[1]
        assert any(ln.startswith("data: {") for ln in lines[:-3])  # it had streamed tokens
        # while the engine is down or loading, CPU-only routes keep answering
        assert parent.get("/v1/models").json()["data"][0]["id"] == LLAMA
        assert parent.client.responses.retrieve(first.id).id == first.id
        parent.wait(lambda: parent.resident()[LLAMA]["state"] == "ready", "the respawn")
        after = parent.engine()
        assert after["restarts"] == 1 and after["pid"] != before["pid"]
        assert greedy(parent, LLAMA) == (LLAMA, reference[LLAMA][0])
        # the new engine never saw `first`; the parent's history carries the conversation
        follow = parent.client.responses.create(model=LLAMA, input="And now?",
                                                previous_response_id=first.id,
                                                max_output_tokens=4)
        assert follow.previous_response_id == first.id
        assert follow.status in ("completed", "incomplete")
    finally:
        stop.set()
        poller.join()
    assert health and all(s == 200 for s in health), [s for s in health if s != 200][:3]


def test_streamed_response_is_stored_by_the_parent(parent):
    with parent.client.responses.create(model=LLAMA, input="Hi", max_output_tokens=4,
                                        stream=True) as events:
        done = [e for e in events if e.type in ("response.completed", "response.incomplete")]
    rid = done[0].response.id
    assert parent.client.responses.retrieve(rid).id == rid
    parent.client.responses.delete(rid)
    with pytest.raises(openai.NotFoundError):
        parent.client.responses.retrieve(rid)


def _completed(parent) -> int:
    return parent.get("/stats").json()["requests"]["completed"]


def _idle_after(parent, before):
    def idle():
        s = parent.get("/stats").json()["requests"]
        return s["completed"] == before + 1 and s["active"] == 0 and s["waiting"] == 0
    parent.wait(idle, "the engine to free the slot", timeout=30)


def test_stream_disconnect_through_the_proxy_frees_the_slot(parent, reference):
    before = _completed(parent)
    with httpx.stream("POST", parent.base + "/v1/completions", timeout=60,
                      json=long_body(reference[LLAMA][1], stream=True)) as r:
        assert r.status_code == 200
        for i, _ in enumerate(r.iter_lines()):
            if i > 5:
                break
    _idle_after(parent, before)


def test_non_stream_disconnect_through_the_proxy_frees_the_slot(parent, reference):
    before = _completed(parent)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(parent.base + "/v1/completions", json=long_body(reference[LLAMA][1]),
                   timeout=1.5)
    _idle_after(parent, before)


def test_engine_children_get_every_flag_but_the_parent_only_ones():
    from mlxbun_core.cli import build_parser
    from mlxbun_core.isolate.launch import engine_argv

    parser = build_parser()
    args = parser.parse_args(["serve", "--isolate", "--model-pool", "3", "--port", "9001",
                              "--host", "0.0.0.0", "--query", "llama", "--model", "x",
                              "--temperature", "0.5", "--batch", "2", "--embedding",
                              "--cors", "https://app.example"])
    argv = engine_argv(args, parser)
    for parent_only in ("--isolate", "--model-pool", "--port", "--host", "--query", "--model",
                        "--cors"):
        assert parent_only not in argv
    child = parser.parse_args(["serve", *argv])
    assert (child.temperature, child.batch, child.embedding) == (0.5, 2, True)
    assert (child.isolate, child.model_pool, child.model, child.query) == (False, 1, None, None)


@pytest.mark.parametrize("key", [None, "sesame"])
def test_parent_applies_the_serve_guard(key, tmp_path, monkeypatch):
    """The engines behind the socket see only the parent, so the parent checks the API key
    and keeps admin routes loopback-only (no engine is started for any of these)."""
    import asyncio

    from mlxbun_core.isolate.parent import ParentApp
    from mlxbun_core.isolate.pool import EnginePool, ModelSpec
    from mlxbun_core.library.cache import LibraryCache

    for k, v in library_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    app = ParentApp(EnginePool(ModelSpec("m", None), []), LibraryCache(), api_key=key)

    async def call(path, client=("127.0.0.1", 5000), method="GET", **headers):
        transport = httpx.ASGITransport(app=app, client=client)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            return await c.request(method, path, headers=headers)

    async def main():
        health = await call("/health")  # open without the key; no engine has answered yet
        assert (health.status_code, health.json()) == (503, {"status": "loading"})
        remote = ("192.0.2.7", 5000)
        if key is None:
            assert (await call("/v1/models", client=remote)).status_code == 200
            r = await call("/api/jobs", client=remote)
            assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
            assert (await call("/admin/drain", method="POST")).status_code == 404
            m = await call("/metrics", client=remote)  # no key: open, as generation routes
            assert m.status_code == 200 and m.headers["content-type"].startswith("text/plain")
            assert 'mlxbun_http_requests_total{method="GET",route="other",status="403"} 1.0' \
                in m.text.splitlines()  # a bounded label for a path the parent does not serve
        else:
            assert (await call("/v1/models")).status_code == 401
            r = await call("/v1/messages", method="POST")
            assert r.status_code == 401 and r.json()["type"] == "error"
            ok = await call("/v1/models", client=remote, authorization="Bearer sesame")
            assert ok.status_code == 200 and ok.json()["data"][0]["id"] == "m"
            assert (await call("/engine", **{"x-api-key": "sesame"})).json()["isolated"] is True
            assert (await call("/metrics", authorization="Bearer nope")).status_code == 401
            m = await call("/metrics", authorization="Bearer sesame")
            assert m.status_code == 200
            lines = m.text.splitlines()
            assert 'mlxbun_http_requests_total{method="GET",route="/v1/models",status="401"} 1.0' \
                in lines and "mlxbun_pool_engines_max 1.0" in lines
            # the page's static shell loads without the key (it then asks for it)
            shell = [{"type": "http", "method": "GET", "path": p, "client": remote,
                      "headers": []} for p in ("/", "/assets/app.js", "/curves")]
            assert [access.check(s, access.prepare(s), app.rules) for s in shell] == [None] * 3
            api = {"type": "http", "method": "GET", "path": "/v1/models", "client": remote,
                   "headers": []}
            assert access.check(api, access.prepare(api), app.rules).status == 401

    asyncio.run(main())



def test_parent_metrics_survive_engines_that_fail_to_answer():
    """One engine answers, one sends garbage, one is gone: the scrape still answers, with
    the good engine's series labelled and the others marked down (never a 500)."""
    import asyncio
    from types import SimpleNamespace

    from mlxbun_core.metrics.isolate import ParentMetrics

    class Client:
        def __init__(self, answer):
            self.answer = answer

        async def get(self, path, timeout):
            assert path == "/metrics" and timeout > 0
            if isinstance(self.answer, Exception):
                raise self.answer
            return SimpleNamespace(status_code=200, text=self.answer)

    good = "# TYPE mlxbun_x_total counter\nmlxbun_x_total{route=\"/a\"} 3.0\n"
    answers = {"a": good, "b": "not {{ metrics", "c": httpx.ConnectError("gone"), "d": good}
    engines = {m: SimpleNamespace(model_id=m, state="ready" if m != "d" else "starting",
                                  restarts=1, in_flight=0, client=Client(a))
               for m, a in answers.items()}
    pool = SimpleNamespace(engines=engines, evictions=2, cap=3)
    _, body = asyncio.run(ParentMetrics(pool).render())
    lines = body.decode().splitlines()
    assert 'mlxbun_x_total{model="a",route="/a"} 3.0' in lines
    assert not [line for line in lines if 'model="d",route' in line]  # not ready: not asked
    for model, up in (("a", 1), ("b", 0), ("c", 0), ("d", 0)):
        assert f'mlxbun_engine_up{{model="{model}"}} {up}.0' in lines
    assert "mlxbun_pool_evictions_total 2.0" in lines


def test_hub_serve_adds_a_local_model_to_the_pool(parent):
    """The parent owns the pool, so /api/hub/serve starts the model there (no restart);
    a model the library does not hold goes on to the engine, which says to restart."""
    r = httpx.post(parent.base + "/api/hub/serve", json={"model": QWEN}, timeout=30)
    assert r.status_code == 200 and r.json()["ok"] is True and r.json()["pool"] is True
    parent.wait(lambda: parent.resident().get(QWEN, {}).get("state") == "ready", "qwen warm")
    again = httpx.post(parent.base + "/api/hub/serve", json={"model": QWEN}, timeout=30).json()
    assert again["state"] == "ready"
    elsewhere = httpx.post(parent.base + "/api/hub/serve", json={"model": "acme/Not-Local"},
                           timeout=30).json()
    assert elsewhere == {"ok": False, "restart_required": True,
                         "command": "mlxbun serve acme/Not-Local"}


def test_a_draining_parent_says_so_on_health_and_finishes_its_streams(parent, reference):
    """SIGTERM: /health answers 503 draining (it used to be connection-refused), new
    generation gets a 503, the stream being proxied runs to its end, then exit 0.
    Last in the module: it stops the module's parent (the fixture's own stop is then a
    no-op), which saves starting another one."""
    body = {**long_body(reference[LLAMA][1], max_tokens=1500), "stream": True}
    with httpx.stream("POST", parent.base + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()  # unread, the stream stays in flight through the parent
        next(line for line in lines if line.startswith("data: {"))
        parent.proc.send_signal(signal.SIGTERM)
        parent.wait(lambda: parent.get("/health").status_code == 503, "a draining /health", 15)
        assert parent.get("/health").json() == {"status": "draining"}
        refused = httpx.post(parent.base + "/v1/completions",
                             json={"prompt": "hi", "max_tokens": 2})
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "shutting_down"
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    ends = [c["choices"][0]["finish_reason"] for c in map(json.loads, (x[6:] for x in rest[:-1]))
            if c.get("choices") and c["choices"][0].get("finish_reason")]
    assert ends == ["length"]
    assert parent.proc.wait(60) == 0
