"""``mlxbun chat [MODEL]``: a terminal chat with a served model.

It talks to a server through the OpenAI chat route, streaming each reply as it is made,
and keeps the conversation (every turn goes back with the next message). On a terminal
the input line has readline's editing and a history kept across sessions
(``<home>/chat_history``); piped input is read a message a line, which is how scripts and
tests drive it. Ctrl-C stops a reply (the server cancels it) and keeps what came; Ctrl-D or
``/exit`` ends the chat, and a server the chat started is stopped with it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Any

import httpx

from .finder import NoServer, Server, find_or_start

HELP = """commands:
  /clear        forget the conversation (the system prompt stays)
  /exit, /bye   end the chat (also Ctrl-D)
  /help         this list
  \"\"\"           on a line of its own: start or end a message of several lines
Ctrl-C stops a reply; what came stays in the conversation."""
QUIT = ("/exit", "/bye", "/quit")
DIM, RESET = "\x1b[2m", "\x1b[0m"


def cmd_chat(args: argparse.Namespace) -> int:
    try:
        server = find_or_start(args.positional, url=args.url, host=args.host, port=args.port)
    except NoServer as exc:
        print(f"mlxbun: {exc}", file=sys.stderr)
        return exc.status
    try:
        return Chat(server, args).run()
    finally:
        server.stop()


class Chat:
    def __init__(self, server: Server, args: argparse.Namespace):
        self.server = server
        self.system = args.system
        self.options = {k: v for k, v in (("max_tokens", args.max_tokens),
                                          ("temperature", args.temperature)) if v is not None}
        self.messages: list[dict[str, str]] = []
        self.terminal = sys.stdin.isatty()
        self.colour = sys.stdout.isatty()

    def run(self) -> int:
        print(f"mlxbun chat · {self.server.model} at {self.server.base_url} · /help for "
              "commands, Ctrl-D to quit", file=sys.stderr, flush=True)
        with self.line_history():
            while True:
                try:
                    text = self.read_message()
                except KeyboardInterrupt:  # at the prompt: a fresh line, as a shell does
                    print(file=sys.stderr)
                    continue
                if text is None or text.strip() in QUIT:
                    return 0
                if text.strip() == "/clear":
                    self.messages.clear()
                    print("(conversation cleared)", file=sys.stderr, flush=True)
                elif text.strip() == "/help":
                    print(HELP, file=sys.stderr, flush=True)
                elif text.strip():
                    self.turn(text)

    def read_message(self) -> str | None:
        """One message: a line, or the lines between two ``\"\"\"`` lines; None at EOF."""
        try:
            line = input(">>> " if self.terminal else "")
        except EOFError:
            if self.terminal:
                print(file=sys.stderr)
            return None
        if line.strip() != '"""':
            return line
        lines = []
        while True:
            try:
                more = input("... " if self.terminal else "")
            except EOFError:
                break
            if more.strip() == '"""':
                break
            lines.append(more)
        return "\n".join(lines)

    def turn(self, text: str) -> None:
        """Send ``text`` with the conversation; stream the reply; keep both (a failed
        request keeps neither, so the next message goes out as if it never happened)."""
        self.messages.append({"role": "user", "content": text})
        reply = self.stream_reply()
        if reply is None:
            self.messages.pop()
        else:
            self.messages.append({"role": "assistant", "content": reply})

    def body(self) -> dict[str, Any]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return {"model": self.server.model, "messages": system + self.messages,
                "stream": True, "stream_options": {"include_usage": True}, **self.options}

    def stream_reply(self) -> str | None:
        """The reply as it streams (None: the server refused it, said on stderr)."""
        out: list[str] = []
        thinking = False
        usage: dict[str, Any] = {}
        try:
            for chunk in self.chunks():
                if "error" in chunk:  # an error event mid-stream: the reply is not kept
                    print(f"\nmlxbun: {error_text(json.dumps(chunk).encode(), 200)}",
                          file=sys.stderr)
                    return None
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    if delta.get("reasoning") and self.colour:  # thinking: dim, on a terminal
                        self.write(("" if thinking else DIM) + delta["reasoning"])
                        thinking = True
                    if delta.get("content"):
                        self.write((RESET + "\n" if thinking else "") + delta["content"])
                        thinking = False
                        out.append(delta["content"])
        except KeyboardInterrupt:  # leaving the stream closes the connection: the server stops
            self.write((RESET if thinking else "") + "\n[stopped]")
        except httpx.HTTPError as exc:
            print(f"\nmlxbun: the server went away: {exc}", file=sys.stderr)
            return None
        except ReplyRefused as exc:
            print(f"mlxbun: {exc}", file=sys.stderr)
            return None
        self.write((RESET if thinking else "") + "\n")
        self.say_usage(usage)
        return "".join(out)

    def chunks(self) -> Iterator[dict[str, Any]]:
        """The SSE chunks of one streamed chat completion."""
        with httpx.Client(timeout=httpx.Timeout(None, connect=10.0)) as client, \
                client.stream("POST", self.server.base_url + "/v1/chat/completions",
                              json=self.body()) as r:
            if r.status_code != 200:
                raise ReplyRefused(error_text(r.read(), r.status_code))
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                with contextlib.suppress(ValueError):
                    yield json.loads(data)

    def write(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def say_usage(self, usage: dict[str, Any]) -> None:
        if self.colour and usage.get("completion_tokens"):
            print(f"{DIM}({usage['completion_tokens']} tokens){RESET}", file=sys.stderr)

    @contextlib.contextmanager
    def line_history(self) -> Iterator[None]:
        """readline's editing and a history kept across sessions, on a terminal only."""
        if not self.terminal:
            yield
            return
        try:
            import readline
        except ImportError:  # Windows without pyreadline: plain input()
            yield
            return
        from ..models.paths import mlxbun_home

        path = mlxbun_home() / "chat_history"
        with contextlib.suppress(OSError):
            readline.read_history_file(path)
        readline.set_history_length(1000)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                path.parent.mkdir(parents=True, exist_ok=True)
                readline.write_history_file(path)


class ReplyRefused(Exception):
    """The server answered the request with an error status."""


def error_text(body: bytes, status: int) -> str:
    """The message of an error body (OpenAI's shape), else the status."""
    try:
        error = json.loads(body).get("error") or {}
        message = error.get("message") if isinstance(error, dict) else str(error)
    except (ValueError, AttributeError):
        message = None
    hint = " (/clear starts a fresh conversation)" if "context" in str(message) else ""
    return f"{message or 'the server answered ' + str(status)}{hint}"
