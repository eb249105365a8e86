"""The process that holds a single-machine launch's private network namespace.

``python -m mirrorkit.launcher.netns_holder [EGRESS_SOCKET]`` moves itself into
a new network namespace (and, without root, a new user namespace that maps
only the caller's own uid and gid), brings its loopback up, and prints one
line: ``READY <relay port>`` or ``UNAVAILABLE <reason>``. The workers then
join that namespace (:mod:`mirrorkit.launcher.isolation`), so their
TensorFlow servers, which always bind ``0.0.0.0``, listen on this private
loopback only. With ``EGRESS_SOCKET``, it also relays TCP connections made to
``127.0.0.1:<relay port>`` inside the namespace to that Unix socket, where the
launcher's proxy (:mod:`mirrorkit.launcher.egress`) reaches the network for
the workers' downloads. It lives until its standard input closes or the
launcher dies (then it removes the relay's folder, which a SIGKILLed launcher
could not). No TensorFlow here: it starts in milliseconds.

Example:
    $ python -m mirrorkit.launcher.netns_holder /tmp/x/egress.sock
    READY 40123
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import shutil
import signal
import socket
import struct
import sys
import threading

from mirrorkit.launcher.egress import pump
from mirrorkit.launcher.isolation import CLONE_NEWNET, CLONE_NEWUSER

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _unshare() -> None:
    libc = _libc()
    # Root makes a network namespace directly; anyone else needs a user
    # namespace to own it (unprivileged user namespaces, on by default on
    # most Linux distributions).
    own_user = os.geteuid() != 0
    flags = CLONE_NEWNET | (CLONE_NEWUSER if own_user else 0)
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEW{'USER|CLONE_NEW' if own_user else ''}NET): "
                           f"{os.strerror(err)}")
    if own_user:
        # Map only ourselves, to ourselves: files keep their owner.
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | _IFF_UP))


def _relay(server: socket.socket, egress: str) -> None:
    while True:
        conn, _ = server.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(egress)
        except OSError:
            conn.close()
            upstream.close()
            continue
        for a, b in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=pump, args=(a, b), daemon=True).start()


def main(argv: list[str]) -> int:
    """Run the holder (see the module docstring)."""
    if len(argv) > 1:
        # The launcher removes the relay's private folder when it ends; if it
        # is killed outright, this process is told (below) and does it instead.
        folder = os.path.dirname(argv[1])
        signal.signal(signal.SIGTERM, lambda *_: (shutil.rmtree(folder, ignore_errors=True),
                                                  os._exit(0)))
    if sys.platform.startswith("linux"):
        # Die with the launcher, even if it is SIGKILLed.
        _libc().prctl(1, int(signal.SIGTERM))
    try:
        _unshare()
        _loopback_up()
    except OSError as err:
        print(f"UNAVAILABLE {err.strerror or err}", flush=True)
        return 0
    port = 0
    if len(argv) > 1:
        server = socket.create_server(("127.0.0.1", 0))
        port = server.getsockname()[1]
        threading.Thread(target=_relay, args=(server, argv[1]), daemon=True).start()
    print(f"READY {port}", flush=True)
    sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
