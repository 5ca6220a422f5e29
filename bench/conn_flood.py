"""Does a connection flood stop the server? Idle sockets, never-ending chunked bodies and
slowloris headers against a real ``mlxbun serve``, while ``/health`` is timed.

    python bench/conn_flood.py --idle 2100 --chunked 50 --slow 200 --seconds 45

The server (a tiny random checkpoint) runs in its own process with its log in a file.
The flood opens its sockets as fast as the server accepts them; the idle ones send
nothing, the chunked ones send a request head then a one-byte chunk every second, the
slowloris ones send a header line every 5 s and never finish. Every 0.5 s a fresh
connection asks ``/health`` (5 s timeout). Reported: /health latency (median, p99, max,
failures), how many flood sockets the server still held at the end, the log's growth
and its "accept() out of system resource" lines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_home  # this folder

HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")


class Flood:
    def __init__(self) -> None:
        self.open = {"idle": 0, "chunked": 0, "slow": 0}
        self.failed_connects = 0
        self.tasks: list[asyncio.Task] = []

    async def one(self, port: int, kind: str, stop: asyncio.Event) -> None:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port), 10)
        except (OSError, asyncio.TimeoutError):
            self.failed_connects += 1
            return
        self.open[kind] += 1
        closed = asyncio.ensure_future(reader.read(65536))  # b"" or an error: the server hung up
        try:
            if kind == "chunked":
                writer.write(HEAD)
            elif kind == "slow":
                writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            n = 0
            while not stop.is_set():
                waits = {closed, asyncio.ensure_future(stop.wait())}
                done, _ = await asyncio.wait(waits, timeout=1.0 if kind == "chunked" else 5.0,
                                             return_when=asyncio.FIRST_COMPLETED)
                for w in waits - {closed}:
                    w.cancel()
                if closed in done:
                    break
                n += 1
                if kind == "chunked":
                    writer.write(b"1\r\n \r\n")
                elif kind == "slow":
                    writer.write(b"X-Slow-%d: x\r\n" % n)
                await writer.drain()
        except (OSError, ConnectionError):
            closed.cancel()  # a write failed: the server hung up
            self.open[kind] -= 1
            return
        finally:
            writer.close()
        if closed.done():  # the server hung up
            self.open[kind] -= 1
        else:
            closed.cancel()


async def health(port: int) -> float | None:
    start = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
        writer.write(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        data = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    except (OSError, asyncio.TimeoutError):
        return None
    return time.perf_counter() - start if data.startswith(b"HTTP/1.1 200") else None


async def measure(port: int, args: argparse.Namespace) -> dict:
    flood, stop = Flood(), asyncio.Event()
    for kind, count in (("idle", args.idle), ("chunked", args.chunked), ("slow", args.slow)):
        for _ in range(count):
            flood.tasks.append(asyncio.ensure_future(flood.one(port, kind, stop)))
            await asyncio.sleep(0)  # connect as fast as the server accepts
    latencies: list[float] = []
    failures = 0
    began = time.monotonic()
    end, worst_at = began + args.seconds, 0.0
    while time.monotonic() < end:
        asked = time.monotonic() - began
        took = await health(port)
        if took is None:
            failures += 1
        else:
            if not latencies or took > max(latencies):
                worst_at = asked
            latencies.append(took)
        await asyncio.sleep(0.5)
    held = dict(flood.open)
    stop.set()
    await asyncio.gather(*flood.tasks, return_exceptions=True)
    lat = sorted(latencies)
    return {"health_ok": len(lat), "health_failed": failures,
            "health_ms_median": round(statistics.median(lat) * 1e3, 1) if lat else None,
            "health_ms_p99": round(lat[int(len(lat) * 0.99) - 1] * 1e3, 1) if lat else None,
            "health_ms_max": round(lat[-1] * 1e3, 1) if lat else None,
            "health_worst_at_s": round(worst_at, 1),  # after the flood's sockets were opened
            "flood_held_at_end": held, "flood_connect_failures": flood.failed_connects}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--idle", type=int, default=2100)
    p.add_argument("--chunked", type=int, default=50)
    p.add_argument("--slow", type=int, default=200)
    p.add_argument("--seconds", type=float, default=45)
    p.add_argument("--out", default=None)
    p.add_argument("serve_flags", nargs="*", help="extra `mlxbun serve` flags (after --)")
    bench_home.add_flag(p)
    args = p.parse_args()
    bench_home.use(args.home)
    import resource

    from mlxbun_core.testing.checkpoints import tiny_checkpoint
    from mlxbun_core.testing.server import free_port

    port, ckpt = free_port(), str(tiny_checkpoint("llama", seed=3))
    # the flood's own sockets (importing mlx_lm.utils lowered this process's limit)
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    fd, log_path = tempfile.mkstemp(prefix="conn_flood_", suffix=".log")
    log = os.fdopen(fd, "wb")
    server = subprocess.Popen([sys.executable, "-m", "mlxbun_core.cli", "serve",
                               ckpt, "--port", str(port),
                               "--no-open", *args.serve_flags], stdout=log, stderr=log)
    try:
        import httpx

        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit(Path(log_path).read_text()) from None
                time.sleep(0.2)
        before = os.path.getsize(log_path)
        out = asyncio.run(measure(port, args))
        text = Path(log_path).read_bytes()
        limits = Path(f"/proc/{server.pid}/limits").read_text()
        out.update(log_bytes=len(text) - before,
                   accept_error_lines=text.count(b"out of system resource"),
                   server_nofile=next(line.split()[3:5] for line in limits.splitlines()
                                      if line.startswith("Max open files")),
                   flood={"idle": args.idle, "chunked": args.chunked, "slow": args.slow,
                          "seconds": args.seconds}, log=log_path)
    finally:
        log.close()
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
    print(json.dumps(out, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
