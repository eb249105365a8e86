"""Keep a single-machine launch's TensorFlow servers off the network.

TensorFlow's gRPC servers have no authentication and always listen on every
interface (``0.0.0.0``; there is no bind-address option). For
``mirrorkit launch -n N`` on one machine the workers only need to reach each
other, so they run in a private network namespace whose only interface is
loopback: from the machine's network, and from anyone who can reach it,
nothing of the job listens. Downloads still work: workers get
``HTTPS_PROXY``/``HTTP_PROXY`` pointing at a relay inside the namespace that
reaches the network through the launcher (:mod:`mirrorkit.launcher.egress`).

What it means elsewhere: GPU collectives within one machine (NCCL over
PCIe/NVLink/shared memory) need no network interface; a worker that must
reach a service other than HTTP(S) (a database, a non-HTTP filesystem, a
TensorBoard profiler connecting in) needs the opt-out,
``--expose-network``. Requires Linux and either root or unprivileged user
namespaces (the default on most distributions); otherwise the launcher says
so in one line and the workers listen as plain TensorFlow's do.

Example:
    >>> isolation = NetworkIsolation.start()                   # doctest: +SKIP
    >>> isolation.env()["HTTPS_PROXY"]                         # doctest: +SKIP
    'http://127.0.0.1:40123'
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Mapping

from mirrorkit import _env
from mirrorkit.launcher.egress import EgressProxy
from mirrorkit.protocol import NETWORK_ISOLATED

_LOOPBACK = ("localhost", "127.0.0.1", "::1")
# setns/unshare flags (linux/sched.h).
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000


class IsolationUnavailable(RuntimeError):
    """This platform or user cannot make a private network namespace."""


class NetworkIsolation:
    """A private loopback-only network namespace for this launch's workers.

    Create it with :meth:`start`; each worker calls :meth:`enter` between
    fork and exec; :meth:`close` ends it.
    """

    def __init__(self, holder: subprocess.Popen, relay_port: int, folder: str,
                 proxy: EgressProxy) -> None:
        self._holder = holder
        self.relay_port = relay_port
        self._folder = folder
        self._proxy = proxy
        pid = holder.pid
        # Opened now, in the launcher: between fork and exec only setns runs.
        self._fds = []
        if self._user_namespace(pid):
            self._fds.append((os.open(f"/proc/{pid}/ns/user", os.O_RDONLY), CLONE_NEWUSER))
        self._fds.append((os.open(f"/proc/{pid}/ns/net", os.O_RDONLY), CLONE_NEWNET))
        self._setns = ctypes.CDLL(None, use_errno=True).setns

    @staticmethod
    def _user_namespace(pid: int) -> bool:
        return os.readlink(f"/proc/{pid}/ns/user") != os.readlink("/proc/self/ns/user")

    @classmethod
    def start(cls, env: Mapping[str, str] | None = None,
              parent: str | None = None) -> "NetworkIsolation":
        """Make the namespace (and the download relay) or raise :class:`IsolationUnavailable`.

        Args:
            env: the environment whose proxies the relay uses. Defaults to the launcher's.
            parent: where the relay's private folder goes (the job's scratch
                root). Defaults to the temp dir, also when the socket's path
                would be too long for a Unix socket there.

        Example:
            >>> NetworkIsolation.start().close()      # doctest: +SKIP
        """
        if not sys.platform.startswith("linux"):
            raise IsolationUnavailable(f"network namespaces are Linux only (this is {sys.platform})")
        if parent is not None and len(os.path.join(parent, "net", "egress.sock")) <= 107:
            # A Unix socket's path holds at most 107 bytes (sun_path).
            folder = os.path.join(parent, "net")
            os.mkdir(folder, 0o700)
        else:
            folder = tempfile.mkdtemp(prefix="mirrorkit-net-")   # 0700: only this user
        proxy = EgressProxy(os.path.join(folder, "egress.sock"), env)
        try:
            proxy.start()
            holder = subprocess.Popen(
                [sys.executable, "-m", "mirrorkit.launcher.netns_holder", proxy.path],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                    filter(None, [_package_root(), os.environ.get("PYTHONPATH")]))})
            line = _first_status_line(holder)
        except OSError as err:
            proxy.close()
            shutil.rmtree(folder, ignore_errors=True)
            raise IsolationUnavailable(str(err)) from err
        if not line.startswith("READY "):
            holder.kill()
            holder.wait()
            proxy.close()
            shutil.rmtree(folder, ignore_errors=True)
            reason = line.removeprefix("UNAVAILABLE ") or holder.stderr.read().strip()[-300:]
            raise IsolationUnavailable(reason or "the namespace holder exited")
        return cls(holder, int(line.split()[1]), folder, proxy)

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The variables a worker needs: proxies to the relay, loopback exempt.

        Example:
            >>> isolation.env({"NO_PROXY": "corp.example"})["NO_PROXY"]   # doctest: +SKIP
            'corp.example,localhost,127.0.0.1,::1'
        """
        base = base or {}
        proxy = f"http://127.0.0.1:{self.relay_port}"
        exempt = [h for h in (base.get("NO_PROXY") or base.get("no_proxy") or "").split(",") if h]
        exempt += [h for h in _LOOPBACK if h not in exempt]
        # gRPC (TensorFlow's peers) honours these too: loopback must stay direct.
        values = {"HTTPS_PROXY": proxy, "HTTP_PROXY": proxy, "NO_PROXY": ",".join(exempt)}
        return {**values, **{k.lower(): v for k, v in values.items()}, _env.NETWORK: NETWORK_ISOLATED}

    def enter(self) -> None:
        """Move the calling (just forked, single-threaded) process into the namespace."""
        for fd, kind in self._fds:
            if self._setns(fd, kind) != 0:
                os._exit(126)   # never run a worker outside the namespace it was promised

    def close(self) -> None:
        """End the namespace (its holder) and the relay; idempotent."""
        for fd, _ in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = []
        if self._holder.poll() is None:
            self._holder.kill()
        self._holder.wait()
        for stream in (self._holder.stdin, self._holder.stdout, self._holder.stderr):
            if stream is not None:
                stream.close()
        self._proxy.close()
        shutil.rmtree(self._folder, ignore_errors=True)


def _first_status_line(holder: subprocess.Popen) -> str:
    # A site hook of the interpreter may print first; the holder's line is
    # the one that starts with READY or UNAVAILABLE ("" if it exits silently).
    for line in holder.stdout:
        if line.startswith(("READY ", "UNAVAILABLE ")):
            return line.strip()
    return ""


def _package_root() -> str:
    # The holder imports mirrorkit even when the launcher runs from a checkout.
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
