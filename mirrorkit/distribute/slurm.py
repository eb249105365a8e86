"""Derive a ``TF_CONFIG`` cluster from the environment of a Slurm ``srun`` step.

Inside ``srun``, every task already knows the whole step from Slurm's
variables, so ``srun python train.py`` needs no hand-written ``TF_CONFIG``::

    SLURM_STEP_NODELIST=node[01-02]   SLURM_STEP_TASKS_PER_NODE=2(x2)
    SLURM_STEP_NUM_TASKS=4            SLURM_NODEID=1   SLURM_LOCALID=0

gives every task the worker list ``node01:P, node01:P+1, node02:P,
node02:P+1`` and this task the index 2 -- the layout TensorFlow's
``SlurmClusterResolver`` builds, computed here without ``scontrol`` or
TensorFlow.

Choices (and why):

* Only an ``srun`` *step* forms a cluster (``SLURM_STEP_NUM_TASKS`` or
  ``SLURM_STEP_NODELIST`` present). The batch script itself also carries
  ``SLURM_NTASKS`` and ``SLURM_PROCID=0``, but there only one process runs:
  treating it as worker 0 of N would wait forever for peers that never start.
* A task's index is its node's position in the node list plus
  ``SLURM_LOCALID``, not ``SLURM_PROCID``. For Slurm's default block
  distribution the two are equal; for ``--distribution=cyclic`` only the
  former puts each task at its own ``host:port``.
* Ports: ``MIRRORKIT_SLURM_PORT`` (or ``port_base``) + ``SLURM_LOCALID``. The
  default base is derived from ``SLURM_JOB_ID`` (see :func:`default_port_base`)
  so two jobs sharing a node do not both bind TensorFlow's usual 8888.
* GPUs: with ``MIRRORKIT_SLURM_GPUS_PER_TASK=G``, local task ``L`` gets the
  ``G`` devices ``L*G .. L*G+G-1`` of the node (of ``CUDA_VISIBLE_DEVICES``
  when Slurm set it). When Slurm already bound exactly ``G`` devices to the
  task (``--gpus-per-task``), they are kept as they are.

Set ``MIRRORKIT_SLURM=0`` to ignore Slurm entirely.

Example:
    >>> env = {"SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    ...        "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1", "SLURM_NODEID": "1",
    ...        "SLURM_LOCALID": "0"}
    >>> task = from_env(env, port_base=9000)
    >>> task.cluster.to_dict()["cluster"], task.cluster.task_index
    ({'worker': ['n1:9000', 'n2:9000']}, 1)
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from mirrorkit import _env
from mirrorkit.distribute.cluster import ClusterSpec, parse_tf_config
from mirrorkit.distribute.devices import visible_devices
from mirrorkit.distribute.nodelist import expand_nodelist, expand_tasks_per_node
from mirrorkit.errors import UserInputError

# Base port when neither the argument nor MIRRORKIT_SLURM_PORT is given and
# the job id is unknown; TensorFlow's SlurmClusterResolver uses the same.
FALLBACK_PORT_BASE = 8888
# Job-derived bases live in [12000, 32000): below Linux's ephemeral range
# (32768+), with a block of _PORT_BLOCK ports per job id.
_PORT_FIRST = 12000
_PORT_BLOCK = 8
_PORT_JOBS = 2500


def default_port_base(job_id: str | None) -> int:
    """The first port per node when none is given: derived from the job id.

    ``12000 + 8 * (job_id % 2500)``: the same on every task of a job (so all
    tasks agree without talking), different for jobs that share a node, and
    below the kernel's ephemeral port range. Up to 8 tasks per node never
    overlap the next job id's ports. Without a numeric job id: 8888.

    Example:
        >>> default_port_base("123456"), default_port_base(None)
        (19648, 8888)
    """
    if job_id is None or not job_id.strip().isdigit():
        return FALLBACK_PORT_BASE
    return _PORT_FIRST + _PORT_BLOCK * (int(job_id) % _PORT_JOBS)


@dataclasses.dataclass(frozen=True)
class SlurmTask:
    """This task of a Slurm step, and the cluster every task of the step derives.

    Attributes:
        cluster: the ``TF_CONFIG`` cluster with this task's index.
        hosts: node names of the step, in Slurm's order.
        tasks_per_node: task count on each of ``hosts``.
        node_index: this task's node, as a position in ``hosts``.
        local_id: ``SLURM_LOCALID``, this task's index on its node.
        proc_id: ``SLURM_PROCID``, Slurm's global task rank.
        port_base: the port of local task 0 on every node.
        cuda_visible_devices: the devices this task should see, or None to
            leave ``CUDA_VISIBLE_DEVICES`` as it is.

    Example:
        >>> task = from_env({"SLURM_STEP_NODELIST": "localhost",
        ...                  "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_PROCID": "0",
        ...                  "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}, port_base=7000)
        >>> task.cluster.is_chief, task.address
        (True, 'localhost:7000')
    """

    cluster: ClusterSpec
    hosts: tuple[str, ...]
    tasks_per_node: tuple[int, ...]
    node_index: int
    local_id: int
    proc_id: int
    port_base: int
    cuda_visible_devices: str | None = None

    @property
    def address(self) -> str:
        """This task's own ``host:port``."""
        return self.cluster.address

    def describe(self) -> str:
        """One line for ``mirrorkit info``: where this task sits in the step.

        Example:
            >>> from_env({"SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
            ...           "SLURM_PROCID": "3", "SLURM_NODEID": "1", "SLURM_LOCALID": "1"},
            ...          port_base=9000).describe()
            'node n2 (2 of 2), local task 1 of 2, SLURM_PROCID 3, ports from 9000'
        """
        text = (f"node {self.hosts[self.node_index]} ({self.node_index + 1} of "
                f"{len(self.hosts)}), local task {self.local_id} of "
                f"{self.tasks_per_node[self.node_index]}, SLURM_PROCID {self.proc_id}, "
                f"ports from {self.port_base}")
        if self.cuda_visible_devices is not None:
            text += f", CUDA_VISIBLE_DEVICES={self.cuda_visible_devices}"
        return text

    def environ(self) -> dict[str, str]:
        """The variables to export so TensorFlow sees this task's cluster and GPUs."""
        values = {"TF_CONFIG": self.cluster.to_json()}
        if self.cuda_visible_devices is not None:
            values["CUDA_VISIBLE_DEVICES"] = self.cuda_visible_devices
        return values


def in_step(env: Mapping[str, str]) -> bool:
    """True inside an ``srun`` step (not merely inside an allocation or batch script).

    Example:
        >>> in_step({"SLURM_NTASKS": "2", "SLURM_PROCID": "0"}), in_step(
        ...     {"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0"})
        (False, True)
    """
    return "SLURM_PROCID" in env and (
        "SLURM_STEP_NUM_TASKS" in env or "SLURM_STEP_NODELIST" in env)


def _int_var(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None:
        if default is not None:
            return default
        raise UserInputError(
            f"Slurm step variable {name} is missing; mirrorkit needs it to place "
            "this task. Run under 'srun', or set MIRRORKIT_SLURM=0 to ignore Slurm."
        )
    if not raw.strip().isdigit():
        raise UserInputError(
            f"Slurm variable {name} must be a non-negative integer. "
            f"Received: {name}={raw!r}"
        )
    return int(raw)


def _first(env: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        if env.get(name, "").strip():
            return env[name]
    return None


def _node_index(env: Mapping[str, str], hosts: list[str]) -> int:
    # SLURMD_NODENAME is this node's name as the node list spells it, so it is
    # right for a step on a subset of the job's nodes whatever SLURM_NODEID
    # counts from (the job's first node or the step's).
    name = env.get("SLURMD_NODENAME")
    if name and name in hosts:
        if hosts.count(name) > 1:
            raise UserInputError(
                f"The Slurm node list names this node ({name!r}) more than once. "
                f"Received: nodelist={','.join(hosts)!r}"
            )
        return hosts.index(name)
    node = _int_var(env, "SLURM_NODEID", default=0 if len(hosts) == 1 else None)
    if node >= len(hosts):
        raise UserInputError(
            f"SLURM_NODEID={node} is outside the step's node list of {len(hosts)} "
            f"node(s) ({','.join(hosts)}); set SLURMD_NODENAME or run under 'srun'."
        )
    return node


def from_env(
    env: Mapping[str, str],
    *,
    port_base: int | None = None,
    gpus_per_task: int | None = None,
) -> SlurmTask | None:
    """Derive this task's cluster from Slurm variables; None outside an ``srun`` step.

    Reads ``SLURM_STEP_NODELIST`` (else ``SLURM_JOB_NODELIST``),
    ``SLURM_STEP_TASKS_PER_NODE`` (else ``SLURM_TASKS_PER_NODE``),
    ``SLURM_STEP_NUM_TASKS`` (else ``SLURM_NTASKS``; checked against the
    per-node counts), ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURMD_NODENAME``
    or ``SLURM_NODEID``, and ``SLURM_JOB_ID`` for the default port.

    Args:
        env: the ``SLURM_*`` variables (and ``CUDA_VISIBLE_DEVICES`` when
            set); :func:`current` passes the real environment.
        port_base: port of local task 0 on each node. Defaults to
            :func:`default_port_base`.
        gpus_per_task: give each local task this many GPUs through
            ``CUDA_VISIBLE_DEVICES``. Defaults to None: leave devices alone.

    Returns:
        A :class:`SlurmTask`, or None when this is not an ``srun`` step.

    Raises:
        UserInputError: naming the variable, for inconsistent or malformed values.

    Example:
        >>> from_env({}) is None
        True
    """
    if not in_step(env):
        return None
    nodelist = _first(env, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    if nodelist is None:
        raise UserInputError(
            "Slurm step variable SLURM_STEP_NODELIST is missing; mirrorkit needs it "
            "to list the step's nodes. Run under 'srun', or set MIRRORKIT_SLURM=0."
        )
    hosts = expand_nodelist(nodelist)
    per_node_text = _first(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    ntasks_name = next((n for n in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
                        if env.get(n, "").strip()), None)
    ntasks = _int_var(env, ntasks_name) if ntasks_name else None
    if per_node_text is None:
        if ntasks is None or ntasks % len(hosts):
            raise UserInputError(
                "Slurm step variable SLURM_STEP_TASKS_PER_NODE is missing and "
                f"{ntasks_name or 'SLURM_NTASKS'}={ntasks} does not spread evenly over "
                f"{len(hosts)} node(s). Run under 'srun', or set MIRRORKIT_SLURM=0."
            )
        per_node = [ntasks // len(hosts)] * len(hosts)
    else:
        per_node = expand_tasks_per_node(per_node_text)
    if len(per_node) != len(hosts):
        raise UserInputError(
            f"Slurm lists {len(hosts)} node(s) ({nodelist}) but task counts for "
            f"{len(per_node)} ({per_node_text}); they must match."
        )
    if ntasks is not None and ntasks != sum(per_node):
        raise UserInputError(
            f"Slurm says the step has {ntasks_name}={ntasks} task(s) but the "
            f"per-node counts ({per_node_text}) add up to {sum(per_node)}."
        )
    node = _node_index(env, hosts)
    local = _int_var(env, "SLURM_LOCALID")
    if local >= per_node[node]:
        raise UserInputError(
            f"SLURM_LOCALID={local} is out of range for {per_node[node]} task(s) on "
            f"node {hosts[node]!r}."
        )
    proc = _int_var(env, "SLURM_PROCID")
    base = port_base if port_base is not None else default_port_base(env.get("SLURM_JOB_ID"))
    if base + max(per_node) - 1 > 65535:
        raise UserInputError(
            f"Port base {base} leaves no room for {max(per_node)} task(s) per node; "
            "choose a lower MIRRORKIT_SLURM_PORT."
        )
    workers = [f"{host}:{base + j}" for host, n in zip(hosts, per_node) for j in range(n)]
    index = sum(per_node[:node]) + local
    cluster = parse_tf_config({"cluster": {"worker": workers},
                               "task": {"type": "worker", "index": index}})
    devices = None
    if gpus_per_task is not None:
        devices = _task_devices(local, gpus_per_task, env.get("CUDA_VISIBLE_DEVICES"))
    return SlurmTask(cluster=cluster, hosts=tuple(hosts), tasks_per_node=tuple(per_node),
                     node_index=node, local_id=local, proc_id=proc, port_base=base,
                     cuda_visible_devices=devices)


def current() -> SlurmTask | None:
    """This process's :class:`SlurmTask` from the real environment, or None.

    None outside an ``srun`` step or with ``MIRRORKIT_SLURM=0``. The base port
    comes from ``MIRRORKIT_SLURM_PORT`` and GPUs per task from
    ``MIRRORKIT_SLURM_GPUS_PER_TASK`` when set.

    Raises:
        UserInputError: for malformed Slurm or ``MIRRORKIT_SLURM_*`` values.

    Example:
        >>> task = current()          # doctest: +SKIP
        >>> task.cluster.num_workers  # doctest: +SKIP
        4
    """
    if not _env.slurm_enabled():
        return None
    env = _env.slurm()
    visible = _env.cuda_visible_devices()
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return from_env(env, port_base=_env.slurm_port(), gpus_per_task=_env.slurm_gpus_per_task())


def _task_devices(local: int, per_task: int, visible: str | None) -> str:
    listed = [d.strip() for d in (visible or "").split(",") if d.strip()]
    if len(listed) == per_task:
        # Slurm already bound this task to its own devices (--gpus-per-task).
        return ",".join(listed)
    return visible_devices(local, per_task, visible)
