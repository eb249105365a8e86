"""Ports for the workers of one machine: free ones picked, fixed ones checked.

Example:
    >>> ports = free_ports(2)
    >>> len(set(ports))
    2
"""

from __future__ import annotations

import socket
from typing import Sequence

from mirrorkit.errors import UserInputError


def free_ports(n: int) -> list[int]:
    """Return ``n`` distinct ports that are free on this machine now."""
    # Hold all sockets until all are picked so the n ports are distinct.
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def check_ports_free(ports: Sequence[int]) -> None:
    """Raise ``UserInputError`` naming the first of ``ports`` another process holds."""
    # SO_REUSEADDR as gRPC sets it: a port left in TIME_WAIT by the previous
    # attempt counts as free, a port another process listens on does not.
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("", port))
        except OSError as err:
            raise UserInputError(
                f"Port {port} is already in use on this machine ({err.strerror}); "
                f"workers here need ports {ports[0]}..{ports[-1]}. Choose another "
                "base port, or leave it unset (no --port) to pick free ports."
            ) from err
        finally:
            sock.close()
