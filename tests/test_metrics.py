"""GET /metrics against real servers: requests through the official OpenAI client, the
exposition parsed with prometheus_client's own parser, and every counter, histogram and
gauge checked for the amount it should have moved."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("qwen3")


@pytest.fixture(scope="module")
def serial(ckpt):
    """A second app in the same process, with one row at a time (a queue forms)."""
    s = start_server(ckpt, batch=1)
    yield s
    s.stop()


def no_eos(srv) -> dict:
    return {str(i): -100 for i in srv.engine.model.tokenizer.eos_token_ids}


class Scrape(dict):
    """One /metrics answer: (sample name, labels) -> value."""

    def __call__(self, name: str, **labels) -> float:
        return self.get((name, frozenset(labels.items())), 0.0)

    def labels_of(self, name: str) -> list:
        return [dict(k[1]) for k in self if k[0] == name]


def scrape(srv) -> Scrape:
    r = httpx.get(srv.base_url + "/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    out = Scrape()
    for family in text_string_to_metric_families(r.text):
        assert family.name.startswith("mlxbun_")
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"duplicate sample {key}"
            out[key] = s.value
    return out


def wait_idle(srv, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not srv.engine.idle:
        assert time.monotonic() < deadline, "the engine did not go idle"
        time.sleep(0.02)


def test_requests_move_the_counters_and_histograms(srv, client):
    model = srv.engine.model.id
    before = scrape(srv)
    usages = [client.completions.create(model="m", prompt=f"count {i}", max_tokens=4,
                                        logit_bias=no_eos(srv)).usage for i in range(3)]
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True,
        stream_options={"include_usage": True}, logit_bias=no_eos(srv))
    usages.append([c for c in stream if c.usage][-1].usage)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="m", prompt="x", max_tokens=-1)
    assert httpx.get(srv.base_url + "/v1/models/no-such-model-7f3a").status_code == 404
    assert httpx.get(srv.base_url + "/no/such/path").status_code == 404
    after = scrape(srv)

    def moved(name, **labels):
        return after(name, **labels) - before(name, **labels)

    http, m = "mlxbun_http_requests_total", {"model": model}
    assert moved(http, route="/v1/completions", method="POST", status="200", **m) == 3
    assert moved(http, route="/v1/chat/completions", method="POST", status="200", **m) == 1
    assert moved(http, route="/v1/completions", method="POST", status="400", **m) == 1
    assert moved(http, route="/v1/models/*", method="GET", status="404", **m) == 1
    assert moved(http, route="other", method="GET", status="404", **m) == 1
    routes = {lab["route"] for lab in after.labels_of(http)}
    assert not [r for r in routes if "7f3a" in r or "such/path" in r], routes  # templates only

    assert moved("mlxbun_prompt_tokens_total", **m) == sum(u.prompt_tokens for u in usages)
    assert moved("mlxbun_completion_tokens_total", **m) == 3 * 4 + 5
    assert sum(u.completion_tokens for u in usages) == 3 * 4 + 5
    cached = sum(u.prompt_tokens_details.cached_tokens for u in usages)
    assert moved("mlxbun_prompt_tokens_cached_total", **m) == cached
    assert moved("mlxbun_requests_finished_total", reason="length", lane="batched", **m) == 4
    for hist in ("mlxbun_time_to_first_token_seconds", "mlxbun_time_per_output_token_seconds",
                 "mlxbun_request_queue_seconds", "mlxbun_request_duration_seconds"):
        assert moved(hist + "_count", **m) == 4, hist
        assert moved(hist + "_bucket", le="+Inf", **m) == 4, hist
        assert moved(hist + "_sum", **m) > 0, hist
    # the whole request takes longer than its first token
    assert moved("mlxbun_request_duration_seconds_sum", **m) > \
        moved("mlxbun_time_to_first_token_seconds_sum", **m)


def test_gauges_are_read_from_the_engine_at_scrape_time(srv):
    model = {"model": srv.engine.model.id}
    body = {"prompt": "Go on", "max_tokens": 30000, "stream": True, "logit_bias": no_eos(srv)}
    before = scrape(srv)
    with httpx.stream("POST", srv.v1 + "/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(line for line in lines if line.startswith("data: {"))
        during = scrape(srv)
    wait_idle(srv)
    after = scrape(srv)
    assert during("mlxbun_requests_running", **model) == 1
    assert during("mlxbun_batch_rows_running", **model) == 1
    assert during("mlxbun_memory_kv_reserved_bytes", **model) > 0
    assert after("mlxbun_requests_running", **model) == 0
    assert after("mlxbun_batch_rows_running", **model) == 0
    assert after("mlxbun_memory_kv_reserved_bytes", **model) == 0
    cancelled = {"reason": "cancelled", "lane": "batched", **model}
    assert after("mlxbun_requests_finished_total", **cancelled) - \
        before("mlxbun_requests_finished_total", **cancelled) == 1  # the client left
    admission = srv.engine.admission
    assert after("mlxbun_memory_budget_bytes", **model) == admission.budget_bytes
    assert after("mlxbun_memory_weights_bytes", **model) == admission.weights_bytes
    assert after("mlxbun_memory_active_bytes", **model) > 0
    assert after("mlxbun_requests_waiting_max", **model) == srv.engine.worker.max_waiting
    assert after("mlxbun_batch_rows_max", **model) == srv.engine.batch > 1
    assert after("mlxbun_prefix_cache_max_bytes", **model) == srv.engine.prefix.max_bytes


def test_prefix_cache_hits_and_bytes(srv, client):
    model = {"model": srv.engine.model.id}
    prompt = "The prefix cache keeps this long shared opening. " * 12
    before = scrape(srv)
    first = client.completions.create(model="m", prompt=prompt, max_tokens=2)
    second = client.completions.create(model="m", prompt=prompt, max_tokens=2)
    after = scrape(srv)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    hit = second.usage.prompt_tokens_details.cached_tokens
    assert hit > 0
    assert after("mlxbun_prefix_cache_lookups_total", **model) - \
        before("mlxbun_prefix_cache_lookups_total", **model) == 2
    assert after("mlxbun_prefix_cache_hits_total", **model) - \
        before("mlxbun_prefix_cache_hits_total", **model) == 1
    assert after("mlxbun_prompt_tokens_cached_total", **model) - \
        before("mlxbun_prompt_tokens_cached_total", **model) == hit
    stats = srv.engine.prefix.stats()
    assert after("mlxbun_prefix_cache_bytes", **model) == stats["bytes"] > 0
    assert after("mlxbun_prefix_cache_entries", **model) == stats["entries"] > 0


def test_batch_occupancy_counts_rows_per_decode_step(srv, client):
    model = {"model": srv.engine.model.id}
    before = scrape(srv)
    usages, go = [], threading.Barrier(4)

    def ask(i):
        go.wait()
        usages.append(client.completions.create(model="m", prompt=f"row {i}", max_tokens=24,
                                                logit_bias=no_eos(srv)).usage)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = scrape(srv)
    steps = after("mlxbun_batch_decode_steps_total", **model) - \
        before("mlxbun_batch_decode_steps_total", **model)
    rows = after("mlxbun_batch_decode_rows_total", **model) - \
        before("mlxbun_batch_decode_rows_total", **model)
    assert rows == sum(u.completion_tokens for u in usages) == 4 * 24  # every token, once
    assert 24 <= steps < rows  # rows shared steps: mean occupancy above one


def test_queue_depth_and_per_app_registries(srv, serial):
    """``serial`` decodes one row at a time: a second stream waits in the queue. Its app
    has its own registry: nothing the other server counted shows here."""
    model = {"model": serial.engine.model.id}
    assert scrape(serial)("mlxbun_http_requests_total", route="/v1/completions",
                          method="POST", status="200", **model) == 0
    body = {"prompt": "Go on", "max_tokens": 30000, "stream": True, "logit_bias": no_eos(serial)}

    def stream_a_little():
        with httpx.stream("POST", serial.v1 + "/completions", json=body, timeout=60) as r:
            next(line for line in r.iter_lines() if line.startswith("data: {"))

    with httpx.stream("POST", serial.v1 + "/completions", json=body, timeout=60) as first:
        lines = first.iter_lines()  # kept: a dropped line iterator closes the stream
        next(line for line in lines if line.startswith("data: {"))
        second = threading.Thread(target=stream_a_little)
        second.start()  # it waits behind the first: its headers come once it runs
        deadline = time.monotonic() + 10
        while serial.engine.worker.waiting == 0:
            assert time.monotonic() < deadline, "the second request never queued"
            time.sleep(0.01)
        during = scrape(serial)
    second.join(30)
    assert not second.is_alive()
    wait_idle(serial)
    after = scrape(serial)
    assert during("mlxbun_requests_running", **model) == 1
    assert during("mlxbun_requests_waiting", **model) == 1
    assert during("mlxbun_batch_rows_max", **model) == 1
    assert after("mlxbun_requests_waiting", **model) == 0
    assert after("mlxbun_requests_finished_total", reason="cancelled", lane="serial", **model) == 2
    assert after("mlxbun_http_requests_total", route="/v1/completions", method="POST",
                 status="200", **model) == 2


def test_a_handler_that_fails_is_counted_as_a_500(srv, client, monkeypatch):
    """A route whose handler raises (``/stats`` with a broken section) and a surface whose
    engine fails (turned into its error body) are both counted under status 500; the
    next requests are answered and counted as usual."""
    model = {"model": srv.engine.model.id}

    def broken_section():
        raise RuntimeError("a stats section failed")

    async def failing_start(req):
        raise RuntimeError("the engine failed")

    before = scrape(srv)
    with monkeypatch.context() as m:
        m.setitem(srv.server.config.app.state.stats_providers, "broken", broken_section)
        m.setattr(srv.engine, "start", failing_start)
        assert httpx.get(srv.base_url + "/stats", timeout=30).status_code == 500
        with pytest.raises(openai.InternalServerError, match="the engine failed"):
            client.with_options(max_retries=0).completions.create(
                model="m", prompt="x", max_tokens=2)
    assert httpx.get(srv.base_url + "/stats", timeout=30).status_code == 200
    client.completions.create(model="m", prompt="x", max_tokens=2)
    after = scrape(srv)

    def moved(route, method, status):
        labels = dict(route=route, method=method, status=status, **model)
        return after("mlxbun_http_requests_total", **labels) - before(
            "mlxbun_http_requests_total", **labels)

    assert (moved("/stats", "GET", "500"), moved("/stats", "GET", "200")) == (1, 1)
    assert moved("/v1/completions", "POST", "500") == 1
    assert moved("/v1/completions", "POST", "200") == 1
