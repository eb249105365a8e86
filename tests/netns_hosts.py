"""Test hosts: network namespaces on a private bridge, each a "machine" with its own address.

Each host is a network namespace with loopback up and one veth link to a
bridge in the root namespace; the bridge carries no address, so the hosts
reach one another and nothing else, and the root namespace cannot reach them.
Names resolve inside every host through ``/etc/netns/<ns>/hosts``, which
``ip netns exec`` mounts over ``/etc/hosts``. A link fault is the host side
of its veth going down (``tc netem`` is not available on these kernels).
Everything is removed on exit, also when the test failed: the hosts'
processes are killed, then the namespaces, links and files go.

Only root can do this; :func:`unavailable` says why it cannot run otherwise.

Example:
    with TestHosts(["hosta", "hostb"]) as hosts:
        proc = hosts.popen("hosta", ["ping", "-c", "1", "hostb"])
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Sequence

NETNS_ETC = Path("/etc/netns")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def unavailable() -> str | None:
    """Why namespace hosts cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network-namespace test hosts need root (ip netns add)"
    if shutil.which("ip") is None:
        return "network-namespace test hosts need iproute2's `ip`"
    probe = f"mkprobe{secrets.token_hex(3)}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"this machine refuses network namespaces ({made.stderr.strip()})"
    _ip("netns", "del", probe, check=False)
    return None


class TestHosts:
    """Namespaces ``names`` on one bridge, with addresses 10.231.S.1, .2, ... on a /24.

    Attributes:
        names: the host names, as every host resolves them.
        addresses: name -> IPv4 address.
    """

    __test__ = False  # not a pytest test class

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        tag = secrets.token_hex(2)
        # A subnet of its own per instance; 10.231/16 is private and unrouted here.
        subnet = 1 + secrets.randbelow(250)
        self.addresses = {name: f"10.231.{subnet}.{i + 1}" for i, name in enumerate(self.names)}
        self._ns = {name: f"mk{tag}{name}" for name in self.names}
        self._link = {name: f"mk{tag}v{i}" for i, name in enumerate(self.names)}
        self._bridge = f"mk{tag}br"

    def namespace(self, name: str) -> str:
        """The ``ip netns`` name of host ``name``."""
        return self._ns[name]

    def __enter__(self) -> "TestHosts":
        try:
            _ip("link", "add", self._bridge, "type", "bridge")
            _ip("link", "set", self._bridge, "up")
            hosts_file = "127.0.0.1 localhost\n" + "".join(
                f"{address} {name}\n" for name, address in self.addresses.items())
            for name in self.names:
                ns, link = self._ns[name], self._link[name]
                _ip("netns", "add", ns)
                (NETNS_ETC / ns).mkdir(parents=True, exist_ok=True)
                (NETNS_ETC / ns / "hosts").write_text(hosts_file)
                _ip("link", "add", link, "type", "veth", "peer", "name", f"{link}p")
                _ip("link", "set", f"{link}p", "netns", ns)
                _ip("link", "set", link, "master", self._bridge)
                _ip("link", "set", link, "up")
                inside = ("netns", "exec", ns, "ip")
                _ip(*inside, "link", "set", "lo", "up")
                _ip(*inside, "link", "set", f"{link}p", "name", "eth0")
                _ip(*inside, "addr", "add", f"{self.addresses[name]}/24", "dev", "eth0")
                _ip(*inside, "link", "set", "eth0", "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for name in self.names:
            ns = self._ns[name]
            self.kill_all(name)
            _ip("netns", "del", ns, check=False)
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
            _ip("link", "del", self._link[name], check=False)
        _ip("link", "del", self._bridge, check=False)

    def popen(self, name: str, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` on host ``name`` (``ip netns exec``), in a session of its own."""
        kwargs.setdefault("start_new_session", True)
        return subprocess.Popen(["ip", "netns", "exec", self._ns[name], *argv], **kwargs)

    def run(self, name: str, argv: Sequence[str], *, timeout: float = 60,
            **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` on host ``name`` to completion; output captured as text."""
        return subprocess.run(["ip", "netns", "exec", self._ns[name], *argv],
                              capture_output=True, text=True, timeout=timeout, **kwargs)

    def pids(self, name: str) -> list[int]:
        """Every process running on host ``name``."""
        found = _ip("netns", "pids", self._ns[name], check=False).stdout
        return [int(pid) for pid in found.split()]

    def signal_all(self, name: str, sig: int) -> list[int]:
        """Send ``sig`` to every process of host ``name``; returns their pids."""
        pids = self.pids(name)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return pids

    def kill_all(self, name: str, timeout: float = 10) -> None:
        """SIGKILL every process of host ``name`` and wait until none is left."""
        deadline = time.monotonic() + timeout
        while self.signal_all(name, signal.SIGKILL) and time.monotonic() < deadline:
            time.sleep(0.1)

    def link(self, name: str, up: bool) -> None:
        """Take host ``name``'s network link down (``up=False``) or back up."""
        _ip("link", "set", self._link[name], "up" if up else "down")
