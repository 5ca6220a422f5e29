"""Connections that hold a server hostage: thousands of idle sockets, never-ending chunked
bodies, slowloris heads, a full file table. A real ``mlxbun serve`` (and in-process servers
with small limits) must keep answering ``/health`` and close what dawdles, with a short log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from mlxbun_core.server.connections import ConnectionLimits
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.process import ServerProcess
from mlxbun_core.testing.server import free_port, start_server

CHUNKED_HEAD = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")


def nofile(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/limits") as f:
        row = next(line for line in f if line.startswith("Max open files"))
    soft, hard = row.split()[3:5]
    return int(soft), int(hard)


@pytest.fixture(scope="module")
def served():
    """``mlxbun serve`` with short deadlines, started with a soft open-file limit of 1024
    (it must raise that to the hard limit, and keep it past importing mlx_lm)."""
    port = free_port()
    cmd = [sys.executable, "-m", "mlxbun_core.cli", "serve", str(tiny_checkpoint("llama", seed=3)),
           "--port", str(port), "--no-open", "--idle-timeout", "1", "--header-timeout", "3",
           "--body-min-rate", "1000"]
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # (after the checkpoint's imports)
    proc = ServerProcess(cmd, preexec_fn=lambda: resource.setrlimit(
        resource.RLIMIT_NOFILE, (1024, hard)))
    try:
        proc.wait_for_http(f"http://127.0.0.1:{port}/health", 120)
        yield proc, port, hard
    finally:
        proc.stop()


def test_the_open_file_limit_is_raised_to_the_hard_limit(served):
    proc, _, hard = served
    assert nofile(proc.proc.pid) == (hard, hard)  # mlx_lm.utils would have left (2048, 4096)


async def _flood(port: int, idle: int, chunked: int, slow: int):
    """Open the sockets; then each waits for the server to hang up (or the test to end).
    Returns the tasks (each ends with what the server sent before closing, or None)."""

    first = {"idle": b"", "chunked": CHUNKED_HEAD,
             "slow": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"}

    def connect_saying(said: bytes) -> socket.socket:
        """Connect and send the first bytes back to back, off this busy loop: sent a loop
        turn later, they could come after the server's idle deadline (a silent socket is
        rightly closed without an answer)."""
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.sendall(said)
        sock.setblocking(False)
        return sock

    async def one(kind: str):
        if first[kind]:
            sock = await asyncio.to_thread(connect_saying, first[kind])
            reader, writer = await asyncio.open_connection(sock=sock)
        else:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        got = bytearray()
        try:
            n = 0
            while True:
                try:
                    piece = await asyncio.wait_for(reader.read(4096), 0.5)
                except asyncio.TimeoutError:
                    n += 1
                    if kind == "chunked":
                        writer.write(b"1\r\n \r\n")  # a byte every half second, forever
                    elif kind == "slow" and n % 4 == 0:
                        writer.write(b"X-Slow-%d: x\r\n" % n)  # a header every 2 s, forever
                    continue
                if not piece:
                    return bytes(got)
                got += piece
        except ConnectionError:
            return bytes(got)
        finally:
            writer.close()

    tasks = []
    for kind, count in (("idle", idle), ("chunked", chunked), ("slow", slow)):
        for _ in range(count):
            tasks.append((kind, asyncio.ensure_future(one(kind))))
            await asyncio.sleep(0)
    return tasks


async def _health_ms(port: int) -> float:
    start = time.perf_counter()
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert data.startswith(b"HTTP/1.1 200"), data[:200]
    return (time.perf_counter() - start) * 1e3


def test_a_flood_of_idle_and_slow_connections_leaves_health_answering(served):
    proc, port, hard = served
    idle = 2100
    assert hard > idle + 600, f"the open-file hard limit ({hard}) is too low for this test"
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this client's own sockets
    printed = len(proc.output)

    async def run():
        tasks = await _flood(port, idle=idle, chunked=50, slow=200)
        latencies = []
        for _ in range(30):  # 6 s: past the idle, head and body deadlines
            latencies.append(await _health_ms(port))
            await asyncio.sleep(0.2)
        done, pending = await asyncio.wait([t for _, t in tasks], timeout=10)
        for t in pending:
            t.cancel()
        return latencies, [(kind, t.result() if t in done else None) for kind, t in tasks]

    latencies, ends = asyncio.run(run())
    latencies.sort()
    assert latencies[len(latencies) // 2] < 500 and latencies[-1] < 3000, latencies
    still_open = [kind for kind, got in ends if got is None]
    assert not still_open, f"{len(still_open)} flood sockets still open: {set(still_open)}"
    answers = {kind: [got for k, got in ends if k == kind] for kind in ("chunked", "slow")}
    # a slow head is answered 408 at its deadline, or 503 if a late flood socket (a SYN
    # the kernel's backlog dropped and the client retried) evicted it first: never a bare close
    assert all(got.split(b"\r\n")[0].split(b" ")[1:2] in ([b"408"], [b"503"])
               for got in answers["slow"]), {got[:40] for got in answers["slow"]}
    assert all(b" 408 " in got.split(b"\r\n")[0] for got in answers["chunked"])
    log = proc.output[printed:]
    assert "out of system resource" not in log
    assert len(log) < 4000, log[-4000:]  # a few summary lines, not a line per socket
    assert "connections:" in log


@pytest.fixture(scope="module")
def small():
    """An in-process server that allows 4 connections, 1 s of idling, 1 s for a head and
    then 2000 bytes/s for a body."""
    srv = start_server(tiny_checkpoint("llama", seed=3), limits=ConnectionLimits(
        max_connections=4, idle_timeout=1, header_timeout=1, body_min_rate=2000))
    yield srv
    srv.stop()


def _hold_a_request(port: int) -> socket.socket:
    """A connection whose request runs: its head is in, its body is still coming."""
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
              b"Content-Type: application/json\r\n"
              b"Content-Length: 100000\r\n\r\n" + b" " * 5000)
    return s


def _read_all(s: socket.socket, timeout: float = 5) -> bytes:
    s.settimeout(timeout)
    out = bytearray()
    while piece := s.recv(65536):
        out += piece
    return bytes(out)


def test_past_the_cap_an_idle_connection_makes_room_else_a_clean_503(small):
    port = small.port
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
    time.sleep(0.2)
    assert httpx.get(small.base_url + "/health", timeout=5).status_code == 200
    assert _read_all(idle[0]) == b""  # the quietest one was closed for the newcomer
    for s in idle:
        s.close()
    time.sleep(0.2)

    busy = [_hold_a_request(port) for _ in range(4)]
    time.sleep(0.3)
    r = httpx.get(small.base_url + "/health", timeout=5)  # read whole, never reset
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert "--max-connections" in r.json()["error"]["message"]
    busy[0].close()
    time.sleep(0.3)
    assert httpx.get(small.base_url + "/health", timeout=5).status_code == 200
    for s in busy[1:]:
        s.close()
    stats = httpx.get(small.base_url + "/stats", timeout=5).json()["connections"]
    assert stats["max"] == 4 and 1 <= stats["open"] <= 4
    assert stats["closed"]["evicted"] >= 1 and stats["closed"]["refused"] >= 1


def test_a_half_sent_head_closed_for_a_newcomer_gets_a_503(small):
    port = small.port
    halves = []
    for _ in range(4):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the head not ended
        halves.append(s)
        time.sleep(0.05)
    time.sleep(0.2)
    assert httpx.get(small.base_url + "/health", timeout=5).status_code == 200
    first = _read_all(halves[0])
    assert first.startswith(b"HTTP/1.1 503 "), first[:80]
    assert b"--max-connections" in first and b"retry-after: 1" in first
    for s in halves:
        s.close()


def _post_slowly(port: int, rate: float, size: int) -> bytes:
    """POST a completion whose body (padded with JSON whitespace) goes at ``rate`` B/s."""
    body = json.dumps({"prompt": "Hi", "max_tokens": 1}).encode().ljust(size)
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
              b"Content-Type: application/json\r\n"
              b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body))
    step = max(1, int(rate / 10))
    try:
        for i in range(0, len(body), step):
            s.sendall(body[i:i + step])
            time.sleep(0.1)
    except OSError:
        pass  # the server hung up; its answer is waiting
    return _read_all(s, 10)


def test_a_slow_upload_at_the_minimum_rate_passes_a_trickle_is_cut(small):
    ok = _post_slowly(small.port, rate=4000, size=14000)  # 3.5 s: well past the 1 s grace
    assert ok.startswith(b"HTTP/1.1 200"), ok[:300]
    started = time.monotonic()
    cut = _post_slowly(small.port, rate=300, size=14000)
    assert cut.startswith(b"HTTP/1.1 408"), cut[:300]
    assert b"bytes/s" in cut and time.monotonic() - started < 6
    error = json.loads(cut.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "request_timeout" and error["type"] == "invalid_request_error"


def test_slowloris_heads_and_huge_heads_are_refused(small):
    s = socket.create_connection(("127.0.0.1", small.port))
    started = time.monotonic()
    s.sendall(b"GET /health HTTP/1.1\r\n")
    answer = b""
    try:
        for i in range(20):
            s.sendall(b"X-%d: y\r\n" % i)
            time.sleep(0.3)
    except OSError:
        pass
    answer = _read_all(s)
    assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 4

    s = socket.create_connection(("127.0.0.1", small.port))
    with contextlib.suppress(OSError):  # the server may hang up before it has read it all
        s.sendall(b"GET /health HTTP/1.1\r\n" + b"X-Big: " + b"a" * 70000 + b"\r\n\r\n")
    answer = _read_all(s)
    assert answer.startswith(b"HTTP/1.1 431")
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == \
        "request_header_fields_too_large"

    s = socket.create_connection(("127.0.0.1", small.port))  # Anthropic's shape there
    s.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    answer = _read_all(s)
    assert answer.startswith(b"HTTP/1.1 408")
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["type"] == "error"
    assert httpx.get(small.base_url + "/health", timeout=5).status_code == 200


def test_idle_connections_close_fresh_or_between_requests(small):
    fresh = socket.create_connection(("127.0.0.1", small.port))
    fresh.sendall(b"\r\n")  # bytes that start no request do not keep it open
    started = time.monotonic()
    assert _read_all(fresh) == b"" and time.monotonic() - started < 3
    with httpx.Client() as client:
        assert client.get(small.base_url + "/health").status_code == 200
        time.sleep(2)  # the keep-alive connection is closed meanwhile; a new one is made
        assert client.get(small.base_url + "/health").status_code == 200


ACCEPT_STORM = textwrap.dedent("""
    import asyncio, logging, os, resource, sys
    from mlxbun_core.server.accept_errors import install_accept_error_filter
    logging.basicConfig(level="INFO")
    install_accept_error_filter()
    resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))

    async def main():
        async def hold(reader, writer):
            await asyncio.sleep(60)
        server = await asyncio.start_server(hold, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.sleep(3)
        sys.stderr.flush()
        os._exit(0)
    asyncio.run(main())
""")


def test_a_full_file_table_logs_one_accept_error_line_per_interval():
    proc = subprocess.Popen([sys.executable, "-c", ACCEPT_STORM], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(80)]
    _, err = proc.communicate(timeout=30)
    for c in clients:
        c.close()
    lines = [line for line in err.splitlines() if "out of system resource" in line]
    assert 1 <= len(lines) <= 2, err[:3000]  # asyncio alone logs thousands, with tracebacks
    assert "Too many open files" in lines[0] and "Traceback" not in err, err[:3000]
    if len(lines) == 2:
        assert "more in the last" in lines[1]


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rpartition(")")[2].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, ValueError):
                continue
    return out


def test_the_isolate_parent_guards_its_socket_and_every_process_keeps_the_limit():
    port = free_port()
    cmd = [sys.executable, "-m", "mlxbun_core.cli", "serve", "--isolate",
           str(tiny_checkpoint("llama", seed=3)), "--port", str(port), "--idle-timeout", "1",
           "--header-timeout", "2"]
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    with ServerProcess(cmd, preexec_fn=lambda: resource.setrlimit(
            resource.RLIMIT_NOFILE, (1024, hard))) as proc:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while proc.wait_for_http(base + "/engine", 120).json().get("state") != "ready":
            assert time.monotonic() < deadline, proc.output
            time.sleep(0.2)
        engines = [c for c in _children(proc.proc.pid)
                   if b"--unix" in Path(f"/proc/{c}/cmdline").read_bytes().split(b"\0")]
        assert engines, proc.output
        for pid in (proc.proc.pid, *engines):
            assert nofile(pid) == (hard, hard), pid

        idle = socket.create_connection(("127.0.0.1", port))
        slow = socket.create_connection(("127.0.0.1", port))
        started = time.monotonic()
        slow.sendall(b"GET /health HTTP/1.1\r\n")
        try:
            for i in range(12):
                slow.sendall(b"X-%d: y\r\n" % i)
                time.sleep(0.3)
        except OSError:
            pass
        assert _read_all(idle) == b""
        assert _read_all(slow).startswith(b"HTTP/1.1 408") and time.monotonic() - started < 4
        assert httpx.get(base + "/health", timeout=10).status_code == 200
