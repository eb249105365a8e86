"""Multi-node host checks made before any worker starts.

A peer name that does not resolve, or a ``--node-rank`` whose entry is not
this machine, otherwise shows up only after the join timeout (minutes) as a
TensorFlow ``DeadlineExceeded`` on every node. Both are known before the
first process starts, so the launcher says so at once, in one line.

Example:
    >>> check_hosts(["localhost:2222", "localhost:2224"], node_rank=0)
"""

from __future__ import annotations

import errno
import socket
from typing import Sequence

from mirrorkit.distribute.cluster import parse_address
from mirrorkit.errors import UserInputError


def resolve(host: str) -> list[str]:
    """Every IP address ``host`` resolves to (IPv4 and IPv6), in resolver order.

    Raises:
        UserInputError: when the name does not resolve.

    Example:
        >>> "127.0.0.1" in resolve("localhost")
        True
    """
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise UserInputError(
            f"Host {host!r} does not resolve ({reason}). Every node must resolve every "
            "other node's name: use addresses, or add the names to DNS or /etc/hosts."
        ) from err
    return list(dict.fromkeys(info[4][0] for info in infos))


def is_local_address(address: str) -> bool:
    """Whether this machine owns ``address`` (a socket can bind to it).

    Example:
        >>> is_local_address("127.0.0.1")
        True
    """
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((address, 0))
        return True
    except OSError as err:
        if err.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
            return False
        raise
    finally:
        sock.close()


def check_hosts(addresses: Sequence[str], node_rank: int) -> None:
    """Check a multi-node launch's hosts: all resolve; this node's is this machine.

    Args:
        addresses: each node's first ``host:port``, in node-rank order.
        node_rank: this node's position in ``addresses``.

    Raises:
        UserInputError: one line naming the entry that does not resolve, or this
            node's entry when none of its addresses belongs to this machine.

    Example:
        >>> check_hosts(["localhost:2222", "no-such-host.invalid:2222"], node_rank=0)
        Traceback (most recent call last):
        ...
        mirrorkit.errors.UserInputError: Host 'no-such-host.invalid' does not resolve (...). Every node must ...
    """
    for rank, address in enumerate(addresses):
        host, _ = parse_address(address, field="hosts entry")
        found = resolve(host)
        if rank == node_rank and not any(is_local_address(ip) for ip in found):
            raise UserInputError(
                f"--node-rank {node_rank} names {host!r} ({', '.join(found)}), which is not "
                "an address of this machine. Run each node's launcher with the --node-rank "
                "of its own entry in --hosts.")
