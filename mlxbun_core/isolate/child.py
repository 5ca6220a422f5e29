"""One engine child: ``mlxbun serve --model <path> --unix <socket>`` as a real subprocess.

The parent waits for its ``/health`` over the socket, respawns it when it dies
(at most ``MAX_RESTARTS`` in a rolling ``RESTART_WINDOW_S``; a child that dies
before it ever became ready waits ``EARLY_DEATH_BACKOFF_S`` first), and stops it
with a drain when the pool evicts it. Its stdout/stderr are the parent's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import os
import signal
import sys
import tempfile
import time

import httpx

log = logging.getLogger("mlxbun.isolate")

MAX_RESTARTS = 3
REFUSED = 2  # ``mlxbun serve``'s exit status for a start it refuses (no such model, bad flags)
RESTART_WINDOW_S = 60.0
EARLY_DEATH_BACKOFF_S = 5.0
READY_TIMEOUT_S = 15 * 60.0
STOP_TIMEOUT_S = 10.0
# the engine's wait for idle (60 s) plus its prompt-cache demotion to the SSD tier (60 s)
DRAIN_TIMEOUT_S = 130.0
_counter = 0


class EngineUnavailable(Exception):
    """The engine is down and cannot come back (restart budget spent, or stopped)."""


def socket_path() -> str:
    """A fresh socket path under the temp dir, named by the parent's pid (kept short:
    unix socket paths are limited to ~100 bytes)."""
    global _counter
    _counter += 1
    base = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
    return os.path.join(base, f"mlxbun-{os.getpid()}-{_counter}.sock")


class EngineProcess:
    def __init__(self, model_id: str, model_arg: str | None, engine_argv: list[str],
                 api_key: str | None = None):
        self.model_id = model_id  # the id requests use (updated from the child's /v1/models)
        self.model_arg = model_arg  # what --model pins on the child (None: embedded default)
        self.engine_argv = engine_argv
        self.api_key = api_key
        self.socket = socket_path()
        auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=self.socket),
                                        base_url="http://engine", timeout=None, headers=auth)
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.respawn = True  # False once the parent drains: a child that exits stays down
        self.state = "new"  # new, starting, ready, dead, failed, stopping, stopped
        self.in_flight = 0
        self.demotions = 0  # prompt-cache entries its drains demoted to the SSD tier
        self.last_used = time.monotonic()
        self.keep_alive = math.inf  # seconds it stays loaded once idle (its last request's)
        self.served_row: dict | None = None  # the child's own /v1/models row
        self.machine: dict | None = None  # the child's machine as MLX reports it
        self._ready = asyncio.Event()
        self._changed = asyncio.Event()  # set on every state change, for waiters
        self._crashes: collections.deque = collections.deque()
        self.was_ready = False  # it answered /health once
        self.refused = False  # its first start exited REFUSED: not restarted
        self.faulted = False  # its device failed: down until a successor is ready
        self._watch: asyncio.Task | None = None

    # ---------------------------------------------------------------- life
    def argv(self) -> list[str]:
        pin = ["--model", self.model_arg] if self.model_arg else []
        return [sys.executable, "-m", "mlxbun_core.cli", "serve", *pin, *self.engine_argv,
                "--unix", self.socket]

    async def start(self) -> None:
        await self._spawn()

    async def _spawn(self) -> None:
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        self._set("starting")
        env = {**os.environ, **({"MLXBUN_API_KEY": self.api_key} if self.api_key else {})}
        if self.restarts:  # a test's injected faults are the first engine's only
            env = {k: v for k, v in env.items() if not k.startswith("MLXBUN_FAULT_")}
        self.proc = await asyncio.create_subprocess_exec(*self.argv(), env=env,
                                                         stdin=asyncio.subprocess.DEVNULL)
        log.info("engine %s starting, pid %d", self.model_id, self.proc.pid)
        self._watch = asyncio.ensure_future(self._supervise(self.proc))

    async def _supervise(self, proc: asyncio.subprocess.Process) -> None:
        """Wait for readiness, then for exit; respawn within the restart budget."""
        ready = await self._await_health(proc)
        rc = await proc.wait()
        if self.state in ("stopping", "stopped") or proc is not self.proc:
            return
        if not self.respawn:  # the parent is draining (a Ctrl-C reaches the children too)
            log.info("engine %s (pid %d) exited with %s during shutdown", self.model_id,
                     proc.pid, rc)
            self._set("stopped")
            return
        if rc == REFUSED and not self.was_ready:  # a bad model or flag: the same next time
            log.error("engine %s refused to start (exit %d); not restarted", self.model_id, rc)
            self.refused = True
            self._set("failed")
            return
        log.warning("engine %s (pid %d) exited with %s", self.model_id, proc.pid, rc)
        now = time.monotonic()
        while self._crashes and now - self._crashes[0] > RESTART_WINDOW_S:
            self._crashes.popleft()
        if len(self._crashes) >= MAX_RESTARTS:
            log.error("engine %s: %d restarts within %.0f s; giving up until the server "
                      "restarts", self.model_id, MAX_RESTARTS, RESTART_WINDOW_S)
            self._set("failed")
            return
        self._crashes.append(now)
        self._set("dead")
        if not ready:
            await asyncio.sleep(EARLY_DEATH_BACKOFF_S)
        if self.state == "dead":
            self.restarts += 1
            await self._spawn()

    async def _await_health(self, proc) -> bool:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while proc.returncode is None and time.monotonic() < deadline:
            try:
                r = await self.client.get("/health", timeout=2.0)
                if r.status_code == 200:
                    await self._learn()
                    log.info("engine ready pid %d (%s)", proc.pid, self.model_id)
                    self._set("ready")
                    return True
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
        return False

    async def _learn(self) -> None:
        """What the parent answers for this engine while it is down."""
        try:
            rows = (await self.client.get("/v1/models", timeout=10.0)).json().get("data") or []
            if rows:
                self.served_row = rows[0]
                self.model_id = rows[0].get("id") or self.model_id
            self.machine = (await self.client.get("/fit", timeout=30.0)).json().get("machine")
        except (httpx.HTTPError, ValueError):
            log.debug("engine %s: could not read its model row", self.model_id, exc_info=True)

    def restarting(self, pid: int | None) -> None:
        """Engine ``pid`` said its device failed and it is exiting: until its successor
        answers, requests wait for that one (a later engine is left alone)."""
        if pid is not None and self.proc is not None and self.proc.pid == pid \
                and self.state == "ready":
            self.faulted = True  # /health says 503 until the successor is ready
            self._set("dead")

    async def problem(self) -> tuple[str, str] | None:
        """Why this engine cannot serve: ``("unavailable", why)`` once it gave up
        restarting, ``("restarting", why)`` from when its device failed (its own
        ``/health`` says so) until its successor is ready; None when it serves, loads,
        or is respawned after a plain exit (requests wait for it then)."""
        if self.state == "failed" and self.was_ready:
            return "unavailable", f"engine {self.model_id} stopped restarting"
        if self.faulted and self.state != "ready":
            return "restarting", f"engine {self.model_id} is restarting after a device fault"
        if self.state != "ready":
            return None
        try:
            r = await self.client.get("/health", timeout=2.0)
        except httpx.TimeoutException:
            return None  # busy, not broken
        except httpx.TransportError:
            return None  # gone: the supervisor respawns it, requests wait meanwhile
        try:
            said = r.json() if r.status_code == 503 else {}
        except ValueError:
            said = {}
        if said.get("status") == "unavailable":
            return "restarting", str(said.get("reason") or "engine unavailable")
        return None

    def _set(self, state: str) -> None:
        self.state = state
        if state == "ready":
            self.was_ready, self.faulted = True, False
            self._ready.set()
        else:
            self._ready.clear()
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Return once the child answers; raise EngineUnavailable if it cannot."""
        deadline = time.monotonic() + timeout
        while self.state != "ready" or self.proc is None or self.proc.returncode is not None:
            if self.state in ("failed", "stopping", "stopped"):
                raise EngineUnavailable(f"engine {self.model_id} is {self.state}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise EngineUnavailable(f"engine {self.model_id} not ready in {timeout:.0f} s")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    async def stop(self, drain: bool = True) -> None:
        """Drain (POST /admin/drain on the socket), then terminate; kill if it lingers."""
        if drain and self.state == "ready":
            try:
                r = await self.client.post("/admin/drain", timeout=DRAIN_TIMEOUT_S)
                self.demotions += int(r.json().get("demotions") or 0)
            except (httpx.HTTPError, ValueError, TypeError, AttributeError):
                pass
        self._set("stopping")
        await self.client.aclose()  # an idle keep-alive connection would hold uvicorn's exit 5 s
        proc = self.proc
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
        if self._watch is not None:
            self._watch.cancel()
        self._set("stopped")
        if os.path.exists(self.socket):
            os.unlink(self.socket)

    def describe(self) -> dict:
        proc = self.proc
        alive = proc is not None and proc.returncode is None
        return {"model": self.model_id, "pid": proc.pid if proc is not None and alive else None,
                "restarts": self.restarts, "socket": self.socket, "state": self.state,
                "in_flight": self.in_flight}
