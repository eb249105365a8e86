"""What to launch: :class:`LaunchSpec`, validated on construction.

Example:
    >>> LaunchSpec(command=("python", "t.py"), nproc=2).world_size
    2
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from mirrorkit.distribute.cluster import build_tf_config, parse_address
from mirrorkit.errors import UserInputError
from mirrorkit.protocol import ELASTIC_BATCH_CHOICES

# Host of every worker when all run on this machine.
LOCAL_HOST = "localhost"
# How an elastic job keeps its batch when the worker count changes (MIRRORKIT_ELASTIC_BATCH).
ELASTIC_BATCH_RULES = ELASTIC_BATCH_CHOICES


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value: Any, minimum: int, *, flag: str = "", hint: str = "") -> None:
    if not _is_int(value) or value < minimum:
        kind = "a positive integer" if minimum == 1 else "a non-negative integer"
        raise UserInputError(f"`{name}`{flag} must be {kind}{hint}. Received: {name}={value!r}")


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    """What to launch: the command, how many workers, restarts, ports, devices.

    Args:
        command: program and arguments every worker runs, e.g.
            ``("python", "train.py", "--epochs", "3")``. The program is looked
            up next to the launcher's own Python first (so ``python`` and
            ``mirrorkit`` mean the launcher's environment), then on ``PATH``.
        nproc: workers on this machine.
        max_restarts: whole-group restarts allowed after a failure. Defaults to 0.
        log_dir: also append each worker's output to ``log_dir/worker-<rank>.log``.
            Defaults to None (terminal only).
        port: first of ``nproc`` consecutive ports. If any of them is in use,
            :func:`launch` raises ``UserInputError`` naming the port (a fixed port
            is a promise to the user and to other nodes, so it is never
            silently moved). Defaults to None: free ports, new on each restart.
        gpus_per_worker: give worker ``j`` (local index) GPUs ``j*G..j*G+G-1``
            through ``CUDA_VISIBLE_DEVICES`` (indices into the launcher's own
            ``CUDA_VISIBLE_DEVICES`` when that is set). Defaults to None:
            every worker sees every device.
        grace_period: seconds between SIGTERM and SIGKILL when stopping
            workers. TensorFlow's multi-worker runtime catches SIGTERM (its
            preemption notifier) and keeps running, so for MWMS workers this
            is how long every stop and restart waits; 0 restarts fastest.
            Defaults to 3.
        hosts: multi-node: every node's host, in node-rank order, each
            ``HOST`` (ports from ``port``) or ``HOST:PORT`` (that node's first
            port). All nodes run the same ``nproc``; node ``R`` runs global
            ranks ``R*nproc .. R*nproc+nproc-1``. Defaults to None: one node.
        node_rank: this node's position in ``hosts``. Defaults to 0.
        env: extra environment variables for every worker.
        expose_network: single machine only: let the workers' TensorFlow
            servers listen on every interface, as plain TensorFlow does.
            Defaults to False: they run in a private loopback-only network
            namespace (:mod:`mirrorkit.launcher.isolation`) where the platform
            allows it. Multi-node launches always listen on the network.
        min_workers: elastic training: when a worker is lost (the first to
            fail in two attempts in a row, or on a host that stops answering
            the rendezvous), restart without it while at least this many
            workers (over all nodes) remain; see
            :mod:`mirrorkit.launcher.membership`. Needs ``max_restarts >= 1``.
            Defaults to None: never continue with fewer workers.
        elastic_batch: with ``min_workers``, what workers are told to keep
            when the worker count changes (``MIRRORKIT_ELASTIC_BATCH``):
            ``"global"`` (the global batch) or ``"per-replica"``. Defaults to
            ``"global"`` when ``min_workers`` is set.
        rendezvous_timeout: multi-node with ``min_workers``: seconds the
            rendezvous waits, after the first node reports a failed attempt,
            for the others; a node that has not reported by then is lost.
            Defaults to 30.
        oversubscribe: start ``nproc`` workers even when this machine cannot
            hold them usefully (more than 4 per core, or more than its
            available memory at ~0.7 GB each; :mod:`mirrorkit.launcher.capacity`).
            Defaults to False: :func:`~mirrorkit.launcher.launch` refuses.

    Raises:
        UserInputError: for any invalid field, naming it and the value received.

    Example:
        >>> LaunchSpec(command=("python", "t.py"), nproc=2).world_size
        2
        >>> LaunchSpec(command=("python", "t.py"), nproc=2, hosts=("a", "b"),
        ...            node_rank=1, port=2222).local_ranks
        (2, 3)
    """

    command: tuple[str, ...]
    nproc: int
    max_restarts: int = 0
    log_dir: str | None = None
    port: int | None = None
    gpus_per_worker: int | None = None
    grace_period: float = 3.0
    hosts: tuple[str, ...] | None = None
    node_rank: int = 0
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    expose_network: bool = False
    min_workers: int | None = None
    elastic_batch: str | None = None
    rendezvous_timeout: float = 30.0
    oversubscribe: bool = False

    def __post_init__(self) -> None:
        # Normalise containers so the frozen spec is really immutable.
        object.__setattr__(self, "command", tuple(self.command or ()))
        if self.hosts is not None:
            object.__setattr__(self, "hosts", tuple(self.hosts))
        object.__setattr__(self, "env", dict(self.env or {}))
        if self.log_dir is not None:
            object.__setattr__(self, "log_dir", str(self.log_dir))
        self._validate()
        self._validate_elastic()
        if self.min_workers is not None and self.elastic_batch is None:
            object.__setattr__(self, "elastic_batch", "global")

    def _validate(self) -> None:
        if not self.command or not all(isinstance(a, str) for a in self.command) \
                or not self.command[0].strip():
            raise UserInputError(
                "`command` must name the program every worker runs, e.g. "
                f"'mirrorkit launch -n 2 -- python train.py'. Received: command={self.command!r}"
            )
        _check_int("nproc", self.nproc, 1, flag=" (-n)",
                   hint=": the number of workers to start")
        _check_int("max_restarts", self.max_restarts, 0)
        if self.port is not None and (not _is_int(self.port) or not
                                      1 <= self.port <= 65536 - self.nproc):
            raise UserInputError(
                f"`port` must leave room for {self.nproc} consecutive ports within "
                f"1..65535. Received: port={self.port!r}"
            )
        if self.gpus_per_worker is not None:
            _check_int("gpus_per_worker", self.gpus_per_worker, 1)
        if isinstance(self.grace_period, bool) or not isinstance(
                self.grace_period, (int, float)) or not self.grace_period >= 0:
            raise UserInputError(
                "`grace_period` must be a non-negative number of seconds. "
                f"Received: grace_period={self.grace_period!r}"
            )
        _check_int("node_rank", self.node_rank, 0)
        if self.hosts is None:
            if self.node_rank != 0:
                raise UserInputError(
                    "`node_rank` needs `hosts` (every node's host) to place this "
                    f"node. Received: node_rank={self.node_rank}, hosts=None"
                )
            return
        if not self.hosts:
            raise UserInputError("`hosts` must name at least one node. Received: hosts=()")
        if self.node_rank >= len(self.hosts):
            raise UserInputError(
                f"`node_rank` must be below the number of hosts ({len(self.hosts)}). "
                f"Received: node_rank={self.node_rank}"
            )
        # Building the worker list checks every address and rejects duplicates.
        build_tf_config(self.node_addresses(), 0)

    def _validate_elastic(self) -> None:
        if self.min_workers is not None:
            if not _is_int(self.min_workers) or not 1 <= self.min_workers <= self.world_size:
                raise UserInputError(
                    "`min_workers` (--min-workers) must be an integer from 1 to the number "
                    f"of workers ({self.world_size}). Received: min_workers={self.min_workers!r}")
            if self.max_restarts < 1:
                raise UserInputError(
                    "`min_workers` (--min-workers) continues after a loss by restarting "
                    "without the lost worker, so it needs `max_restarts` (--max-restarts) "
                    "of at least 1 (a worker that fails right after its restart is lost "
                    "at the second restart, so 2 or more on one machine). "
                    f"Received: max_restarts={self.max_restarts}")
        if self.elastic_batch is not None:
            if self.elastic_batch not in ELASTIC_BATCH_RULES:
                raise UserInputError(
                    "`elastic_batch` (--elastic-batch) must be one of "
                    f"{', '.join(ELASTIC_BATCH_RULES)}. Received: "
                    f"elastic_batch={self.elastic_batch!r}")
            if self.min_workers is None:
                raise UserInputError(
                    "`elastic_batch` (--elastic-batch) only applies to an elastic job: "
                    "add --min-workers M. Received: min_workers=None")
        if isinstance(self.rendezvous_timeout, bool) or not isinstance(
                self.rendezvous_timeout, (int, float)) or not self.rendezvous_timeout > 0:
            raise UserInputError(
                "`rendezvous_timeout` (--rendezvous-timeout) must be a positive number of "
                f"seconds. Received: rendezvous_timeout={self.rendezvous_timeout!r}")
        if self.min_workers is not None and self.hosts is not None:
            host, port = self.rendezvous_address()
            taken = {parse_address(a) for a in self.node_addresses()}
            if (host, port) in taken or port > 65535:
                raise UserInputError(
                    f"The rendezvous port {port} on {host} (node 0's first port + -n) is a "
                    "worker's port or out of range: space the nodes' ports further apart.")

    @property
    def nnodes(self) -> int:
        """Number of machines (1 unless ``hosts`` is given)."""
        return len(self.hosts) if self.hosts else 1

    @property
    def world_size(self) -> int:
        """Workers across all nodes."""
        return self.nproc * self.nnodes

    @property
    def local_ranks(self) -> tuple[int, ...]:
        """Global ranks (``TF_CONFIG`` task indexes) of this node's workers."""
        first = self.node_rank * self.nproc
        return tuple(range(first, first + self.nproc))

    def _node_base(self, entry: str) -> tuple[str, int | None]:
        if ":" in entry:
            host, port = parse_address(entry, field="hosts entry")
            if port > 65536 - self.nproc:
                raise UserInputError(
                    f"hosts entry {entry!r} leaves no room for {self.nproc} ports.")
            return host, port
        if not entry.strip() or any(c.isspace() for c in entry):
            raise UserInputError(f"`hosts` entries must be HOST or HOST:PORT. Received: {entry!r}")
        return entry, self.port

    def node_addresses(self, ports: Sequence[int] | None = None) -> list[str]:
        """Every worker's ``host:port`` in rank order.

        Args:
            ports: this node's ports when the spec picks them (single node,
                no ``port``); ignored otherwise.

        Example:
            >>> LaunchSpec(command=("x",), nproc=2, hosts=("a:100", "b"),
            ...            port=200).node_addresses()
            ['a:100', 'a:101', 'b:200', 'b:201']
        """
        if self.hosts is None:
            if ports is None:
                if self.port is None:
                    raise ValueError("node_addresses() needs ports when `port` is unset.")
                ports = range(self.port, self.port + self.nproc)
            return [f"{LOCAL_HOST}:{p}" for p in ports]
        addresses = []
        for entry in self.hosts:
            host, base = self._node_base(entry)
            if base is None:
                raise UserInputError(
                    f"hosts entry {entry!r} has no port and `port` (--port) is unset; "
                    "every node must know every worker's port."
                )
            shown = f"[{host}]" if ":" in host else host
            addresses.extend(f"{shown}:{base + j}" for j in range(self.nproc))
        return addresses

    def rendezvous_address(self) -> tuple[str, int]:
        """Where node 0's launcher hosts the elastic rendezvous: its host, the port after its workers'.

        Example:
            >>> LaunchSpec(command=("x",), nproc=2, hosts=("a", "b"), port=2222,
            ...            min_workers=1, max_restarts=1).rendezvous_address()
            ('a', 2224)
        """
        if self.hosts is None:
            raise ValueError("rendezvous_address() needs `hosts`: one machine has no rendezvous.")
        host, port = parse_address(self.node_addresses()[0])
        return host, port + self.nproc

    def fixed_ports(self) -> list[int] | None:
        """This node's ports when they are fixed by ``port``/``hosts``; else None."""
        if self.hosts is None:
            return None if self.port is None else list(range(self.port, self.port + self.nproc))
        return [parse_address(a)[1] for a in self.node_addresses()[
            self.local_ranks[0]:self.local_ranks[-1] + 1]]
