"""A device that cannot recover is never a healthy-looking server (``MLXBUN_FAULT_DEVICE``,
real ``mlxbun serve`` processes): alone, the server says 503 on ``/health`` at once,
answers what it holds with a 503 to send again and exits 75 for its supervisor, with
one clear line and no abort; under ``--isolate`` the parent holds the requests the
fault left unrun, respawns the engine and has them answered there."""

from __future__ import annotations

import signal
import threading
import time

import httpx

from mlxbun_core.server.drain import DEVICE_FAULT_EXIT
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.process import serve

ABORTS = ("terminate called", "Aborted", "double free", "core dumped", "Segmentation")
BODY = {"model": "m", "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}


class HealthLog:
    """``/health`` polled every 50 ms in a thread: the statuses seen (or the error)."""

    def __init__(self, url: str):
        self.url, self.seen, self._stop = url, [], threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                self.seen.append(httpx.get(self.url, timeout=5).status_code)
            except httpx.HTTPError as exc:
                self.seen.append(type(exc).__name__)
            time.sleep(0.05)

    def first(self, timeout: float = 30) -> object:
        """The first status seen (waits for it)."""
        deadline = time.monotonic() + timeout
        while not self.seen and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.seen[0] if self.seen else None

    def stop(self) -> list:
        self._stop.set()
        self._thread.join(10)
        return self.seen


def post_all(base: str, bodies: list[dict]) -> list:
    """POST every body to ``/v1/completions`` at once; each answer or error."""
    out: list = [None] * len(bodies)

    def one(i: int) -> None:
        try:
            out[i] = httpx.post(base + "/v1/completions", json=bodies[i], timeout=180)
        except httpx.HTTPError as exc:
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert not any(t.is_alive() for t in threads), "a request hung"
    return out


def test_a_sticky_device_fault_ends_the_server_with_75_after_answering_503s():
    server = serve(tiny_checkpoint("llama"), "--no-open", "--batch", "2",
                   env={"MLXBUN_FAULT_DEVICE": "3"}, ready=None)
    base = server.base
    with server:
        assert server.wait_for_http(base + "/health", timeout=120).status_code == 200
        health = HealthLog(base + "/health")
        assert health.first() == 200
        answers = post_all(base, [BODY, {**BODY, "prompt": "Hello"}, {**BODY, "prompt": "Hi"}])
        assert server.proc.wait(timeout=60) == DEVICE_FAULT_EXIT, server.output
        seen = health.stop()
    for r in answers:  # every request: a 503 to send again (none had streamed a byte)
        assert isinstance(r, httpx.Response) and r.status_code == 503, r
        assert r.headers["x-mlxbun-restarting"] == "1" and int(r.headers["retry-after"]) >= 2
        assert r.json()["error"]["code"] == "device_fault"
    assert 503 in seen, seen  # /health said so before the exit
    out = server.output
    assert not any(a in out for a in ABORTS) and "Traceback" not in out, out
    said = [ln for ln in server.lines if "device fault" in ln and "exits with status 75" in ln]
    assert len(said) == 1, out


def test_under_isolate_the_parent_respawns_the_engine_and_keeps_the_requests():
    server = serve("--isolate", tiny_checkpoint("llama"), "--no-open", "--batch", "2",
                   env={"MLXBUN_FAULT_DEVICE": "3"}, ready="/engine", timeout=120)
    base, lines = server.base, server.lines
    try:
        first = httpx.get(base + "/engine", timeout=10).json()
        health = HealthLog(base + "/health")
        assert health.first() == 200
        answers = post_all(base, [BODY, {**BODY, "prompt": "Hello"}, {**BODY, "prompt": "Hi"}])
        seen = health.stop()
        for r in answers:  # held by the parent, answered by the respawned engine
            assert isinstance(r, httpx.Response) and r.status_code == 200, (r, "".join(lines))
            assert r.json()["choices"][0]["finish_reason"] in ("length", "stop")
        after = httpx.get(base + "/engine", timeout=10).json()
        assert after["restarts"] == 1 and after["pid"] != first["pid"], after
        assert 503 in seen, seen  # the parent's /health while the engine's device failed
        assert httpx.get(base + "/health", timeout=10).status_code == 200
    finally:
        server.proc.send_signal(signal.SIGTERM)
        rc = server.wait_for_exit(60)
    out = "".join(lines)
    assert rc == 0, out
    assert not any(a in out for a in ABORTS), out
    assert sum("device fault" in ln and "exits with status 75" in ln for ln in lines) == 1, out
