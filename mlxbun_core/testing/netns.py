"""A remote machine for tests: a network namespace joined to this one by a veth pair.

A client in the namespace reaches the server through a real network interface from a
non-loopback address, as another computer on the LAN would; nothing leaves this machine.
Needs root (``ip netns``), as the tests and CI run. :meth:`RemoteHost.call` runs a function
on a thread that has joined the namespace (a network namespace is per thread in Linux), so
a test uses httpx, ``websockets`` or an SDK there directly, in its own process;
:meth:`RemoteHost.argv` runs a command there.

Each namespace is named after the process that made it and removed when the block ends,
whatever happened in it; one left behind by a killed test run is removed by the next.
"""

from __future__ import annotations

import ctypes
import ipaddress
import itertools
import os
import random
import re
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

PREFIX = "mlxbun-t"
CLONE_NEWNET = 0x40000000
_counter = itertools.count()
_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> None:
    """Remove namespaces (and with them their veth pairs) of test processes that died."""
    listed = _ip("netns", "list", check=False).stdout
    for name in re.findall(rf"^({PREFIX}(\d+)-\d+)", listed, re.M):
        if not _alive(int(name[1])):
            _ip("netns", "del", name[0], check=False)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /30 in 10.64.0.0/10 that no interface of this machine uses."""
    used = [ipaddress.ip_interface(a).network
            for a in re.findall(r"inet (\S+)", _ip("-4", "addr").stdout)]
    pool = ipaddress.ip_network("10.64.0.0/10")
    for _ in range(100):
        base = int(pool.network_address) + random.randrange(pool.num_addresses // 4) * 4
        net = ipaddress.IPv4Network(f"{ipaddress.IPv4Address(base)}/30")
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free /30 in 10.64.0.0/10 for a test namespace")


class RemoteHost:
    """The namespace ``name``: this machine is ``host_ip`` to it; it is ``peer_ip``."""

    def __init__(self, name: str, host_ip: str, peer_ip: str):
        self.name, self.host_ip, self.peer_ip = name, host_ip, peer_ip
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name, initializer=self._join)

    def _join(self) -> None:
        fd = os.open(f"/var/run/netns/{self.name}", os.O_RDONLY)
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns into {self.name}: {os.strerror(err)}")
        finally:
            os.close(fd)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` run from inside the namespace: its sockets are remote."""
        return self._pool.submit(fn, *args, **kwargs).result()

    def argv(self, cmd: list[str]) -> list[str]:
        """``cmd`` run inside the namespace (for ``subprocess``)."""
        return ["ip", "netns", "exec", self.name, *cmd]

    def url(self, port: int, scheme: str = "http") -> str:
        """This machine's address as the namespace reaches it."""
        return f"{scheme}://{self.host_ip}:{port}"

    def close(self) -> None:
        self._pool.shutdown(wait=True)


@contextmanager
def remote_host() -> Iterator[RemoteHost]:
    """A fresh namespace wired to this one; removed when the block ends (a server under
    test must listen on 0.0.0.0 or :attr:`RemoteHost.host_ip` to be reached)."""
    sweep_stale()
    n = next(_counter)
    name = f"{PREFIX}{os.getpid()}-{n}"
    here, there = f"mxh{os.getpid() % 100000}n{n}", f"mxp{os.getpid() % 100000}n{n}"
    net = _free_subnet()
    host_ip, peer_ip = (str(a) for a in list(net.hosts())[:2])
    _ip("netns", "add", name)
    host = None
    try:
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        _ip("link", "set", there, "netns", name)
        _ip("addr", "add", f"{host_ip}/30", "dev", here)
        _ip("link", "set", here, "up")
        for args in (("addr", "add", f"{peer_ip}/30", "dev", there), ("link", "set", there, "up"),
                     ("link", "set", "lo", "up")):
            _ip("netns", "exec", name, "ip", *args)
        host = RemoteHost(name, host_ip, peer_ip)
        yield host
    finally:
        if host is not None:
            host.close()
        _ip("link", "del", here, check=False)  # gone with the namespace too; never left behind
        _ip("netns", "del", name, check=False)
