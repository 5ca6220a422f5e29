"""The listening socket, bound before the model loads (so a busy port is said at once and
nothing can take it while the model loads), with a free port to suggest when it is busy."""

from __future__ import annotations

import errno
import socket


def bind_port(host: str, port: int) -> socket.socket | str:
    """Bind the listening address before the model loads, as uvicorn would.

    Returns the bound socket (uvicorn serves on it later, so nothing can take the
    port in between) or a message saying why the address cannot be used.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as exc:
        sock.close()
        if getattr(exc, "errno", None) == errno.EADDRINUSE:
            hint = free_port_near(host, port)
            return (f"port {port} on {host} is already in use (another mlxbun or server "
                    f"running?). Pick a free one with --port"
                    + (f", e.g. --port {hint} (free now)." if hint else "."))
        return f"cannot listen on {host}:{port}: {exc}"
    sock.set_inheritable(True)
    return sock


def free_port_near(host: str, port: int, tries: int = 100) -> int | None:
    """The first port after ``port`` that ``host`` can bind right now (else one the OS
    picks), for the busy-port hint; None if none can be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for candidate in [*range(port + 1, min(port + 1 + tries, 65536)), 0]:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, candidate))
            except OSError:
                continue
            return int(probe.getsockname()[1])
    return None
