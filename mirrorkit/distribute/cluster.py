"""Parse, validate and build ``TF_CONFIG`` cluster descriptions.

``TF_CONFIG`` is the JSON TensorFlow reads to form a multi-worker cluster::

    {"cluster": {"worker": ["host1:12345", "host2:12345"]},
     "task": {"type": "worker", "index": 0}}

Errors name the field and the value received, so a typo in a Slurm script or a
Kubernetes manifest is found from one line.

Example:
    >>> cfg = build_tf_config(["localhost:2222", "localhost:2223"], index=1)
    >>> spec = parse_tf_config(cfg)
    >>> spec.num_workers, spec.task_index, spec.is_chief
    (2, 1, False)
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Sequence

from mirrorkit.errors import UserInputError

# Task types TensorFlow's cluster resolver knows. "ps" belongs to
# ParameterServerStrategy, "evaluator" is a side-car that does not train.
TASK_TYPES = ("chief", "worker", "evaluator", "ps")
# Task types that take part in synchronous all-reduce training.
TRAINING_TASK_TYPES = ("chief", "worker")


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """A validated ``TF_CONFIG``.

    Attributes:
        cluster: task type -> tuple of ``host:port`` addresses.
        task_type: this process's task type (``"worker"``, ``"chief"``, ...).
        task_index: this process's index within its task type.

    Example:
        >>> spec = parse_tf_config('{"cluster": {"worker": ["a:1", "b:2"]},'
        ...                        ' "task": {"type": "worker", "index": 0}}')
        >>> spec.is_chief, spec.num_workers, spec.rank
        (True, 2, 0)
    """

    cluster: Mapping[str, tuple[str, ...]]
    task_type: str
    task_index: int

    @property
    def num_workers(self) -> int:
        """Number of processes that train (chief + workers)."""
        return sum(len(self.cluster.get(t, ())) for t in TRAINING_TASK_TYPES)

    @property
    def is_chief(self) -> bool:
        """True for the task that writes checkpoints and logs.

        That is ``chief:0`` when the cluster has a chief (Kubeflow TFJob style),
        else ``worker:0``; an evaluator or ps is never the chief.
        """
        if "chief" in self.cluster and self.cluster["chief"]:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_index == 0

    @property
    def rank(self) -> int:
        """Global index among training tasks: chief first, then workers."""
        n_chief = len(self.cluster.get("chief", ()))
        if self.task_type == "chief":
            return self.task_index
        if self.task_type == "worker":
            return n_chief + self.task_index
        return -1

    @property
    def address(self) -> str:
        """This task's own ``host:port``."""
        return self.cluster[self.task_type][self.task_index]

    def to_dict(self) -> dict[str, Any]:
        """Return the TF_CONFIG as a JSON-ready dict."""
        return {
            "cluster": {k: list(v) for k, v in self.cluster.items()},
            "task": {"type": self.task_type, "index": self.task_index},
        }

    def to_json(self) -> str:
        """Return the TF_CONFIG JSON text."""
        return json.dumps(self.to_dict())


def parse_address(address: Any, *, field: str = "address") -> tuple[str, int]:
    """Split and check one ``host:port`` address.

    Args:
        address: the text, e.g. ``"localhost:12345"`` or ``"[::1]:12345"``.
        field: where it came from, used in the error message.

    Returns:
        ``(host, port)``.

    Raises:
        UserInputError: if it is not ``host:port`` with a port in 1..65535.

    Example:
        >>> parse_address("node-1:2222")
        ('node-1', 2222)
    """
    if not isinstance(address, str) or ":" not in address:
        raise UserInputError(
            f"{field} must be 'host:port'. Received: {field}={address!r}"
        )
    host, _, port_text = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or any(c.isspace() for c in address):
        raise UserInputError(
            f"{field} must be 'host:port' with a non-empty host. "
            f"Received: {field}={address!r}"
        )
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535 or not port_text.isdigit():
        raise UserInputError(
            f"{field} must end in a port from 1 to 65535. "
            f"Received: {field}={address!r}"
        )
    return host, port


def parse_hosts(text: str) -> list[str]:
    """Parse a comma-separated host list as given to ``--workers``.

    Example:
        >>> parse_hosts("a:1, b:2")
        ['a:1', 'b:2']
    """
    hosts = [h.strip() for h in str(text).split(",") if h.strip()]
    if not hosts:
        raise UserInputError(
            "The worker list must name at least one 'host:port'. "
            f"Received: workers={text!r}"
        )
    return hosts


def _check_cluster(cluster: Any) -> dict[str, tuple[str, ...]]:
    if not isinstance(cluster, dict):
        raise UserInputError(
            "TF_CONFIG field 'cluster' must be an object mapping task types to "
            f"address lists. Received: cluster={cluster!r}"
        )
    checked: dict[str, tuple[str, ...]] = {}
    seen: dict[str, str] = {}
    for task_type, addresses in cluster.items():
        if task_type not in TASK_TYPES:
            raise UserInputError(
                f"TF_CONFIG field 'cluster' has an unknown task type. "
                f"Received: {task_type!r}; accepted: {', '.join(TASK_TYPES)}"
            )
        if not isinstance(addresses, list) or not addresses:
            raise UserInputError(
                f"TF_CONFIG field 'cluster.{task_type}' must be a non-empty list "
                f"of 'host:port'. Received: cluster.{task_type}={addresses!r}"
            )
        for i, address in enumerate(addresses):
            parse_address(address, field=f"cluster.{task_type}[{i}]")
            where = f"cluster.{task_type}[{i}]"
            if address in seen:
                raise UserInputError(
                    f"TF_CONFIG lists the same address twice: {seen[address]} and "
                    f"{where} are both {address!r}"
                )
            seen[address] = where
        checked[task_type] = tuple(addresses)
    if "chief" in checked and len(checked["chief"]) != 1:
        raise UserInputError(
            "TF_CONFIG field 'cluster.chief' must list exactly one address. "
            f"Received: cluster.chief={list(checked['chief'])!r}"
        )
    if not any(checked.get(t) for t in TRAINING_TASK_TYPES):
        raise UserInputError(
            "TF_CONFIG field 'cluster' must name at least one 'worker' or 'chief'. "
            f"Received: cluster={cluster!r}"
        )
    return checked


def _check_task(task: Any, cluster: Mapping[str, tuple[str, ...]]) -> tuple[str, int]:
    if not isinstance(task, dict):
        raise UserInputError(
            "TF_CONFIG field 'task' must be an object like "
            f'{{"type": "worker", "index": 0}}. Received: task={task!r}'
        )
    task_type = task.get("type")
    if task_type not in TASK_TYPES:
        raise UserInputError(
            f"TF_CONFIG field 'task.type' is not a known task type. "
            f"Received: task.type={task_type!r}; accepted: {', '.join(TASK_TYPES)}"
        )
    if task_type not in cluster:
        raise UserInputError(
            f"TF_CONFIG field 'task.type' names a task type the cluster does not "
            f"list. Received: task.type={task_type!r}; cluster has: "
            f"{', '.join(cluster)}"
        )
    index = task.get("index", 0)
    if isinstance(index, str) and index.isdigit():
        index = int(index)
    if isinstance(index, bool) or not isinstance(index, int):
        raise UserInputError(
            f"TF_CONFIG field 'task.index' must be an integer. Received: "
            f"task.index={index!r}"
        )
    size = len(cluster[task_type])
    if not 0 <= index < size:
        raise UserInputError(
            f"TF_CONFIG field 'task.index' is out of range for {size} "
            f"{task_type} task(s) (accepted 0..{size - 1}). Received: "
            f"task.index={index}"
        )
    return task_type, index


def parse_tf_config(text: str | Mapping[str, Any]) -> ClusterSpec:
    """Parse and validate a ``TF_CONFIG`` (JSON text or an already-loaded dict).

    Args:
        text: the JSON text of ``TF_CONFIG``, or the decoded dict.

    Returns:
        A frozen :class:`ClusterSpec`.

    Raises:
        UserInputError: naming the field and the value received, for: not JSON,
            missing ``cluster`` or ``task``, unknown task type, index out of
            range, empty worker list, duplicate addresses, bad ``host:port``.

    Example:
        >>> parse_tf_config('{"cluster": {"worker": ["h:1"]},'
        ...                 ' "task": {"type": "worker", "index": 0}}').num_workers
        1
    """
    if isinstance(text, Mapping):
        data: Any = dict(text)
    else:
        try:
            data = json.loads(text)
        except (TypeError, json.JSONDecodeError) as err:
            shown = text if len(str(text)) <= 80 else str(text)[:77] + "..."
            raise UserInputError(
                f"TF_CONFIG is not valid JSON ({err}). Received: TF_CONFIG={shown!r}"
            ) from err
    if not isinstance(data, dict):
        raise UserInputError(
            "TF_CONFIG must be a JSON object with 'cluster' and 'task'. "
            f"Received: TF_CONFIG={text!r}"
        )
    for field in ("cluster", "task"):
        if field not in data:
            raise UserInputError(
                f"TF_CONFIG is missing the field {field!r}. Received keys: "
                f"{sorted(data)!r}"
            )
    cluster = _check_cluster(data["cluster"])
    task_type, task_index = _check_task(data["task"], cluster)
    return ClusterSpec(cluster=cluster, task_type=task_type, task_index=task_index)


def build_tf_config(
    workers: Sequence[str],
    index: int,
    *,
    task_type: str = "worker",
    chief: str | None = None,
) -> str:
    """Build the TF_CONFIG JSON for one task of a cluster.

    Args:
        workers: ``host:port`` of every worker, in rank order.
        index: this task's index within ``task_type``.
        task_type: ``"worker"`` (default) or ``"chief"``.
        chief: optional address of a separate chief task (Kubeflow style);
            without it worker 0 is the chief.

    Returns:
        The JSON text, validated by :func:`parse_tf_config`.

    Raises:
        UserInputError: for a bad address, duplicate, or index out of range.

    Example:
        >>> build_tf_config(["a:1", "b:2"], 0)
        '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}'
    """
    if task_type not in TRAINING_TASK_TYPES:
        raise UserInputError(
            f"task_type must be one of {', '.join(TRAINING_TASK_TYPES)}. "
            f"Received: task_type={task_type!r}"
        )
    cluster: dict[str, list[str]] = {}
    if chief is not None:
        cluster["chief"] = [chief]
    if workers:
        cluster["worker"] = list(workers)
    if task_type == "chief" and chief is None:
        raise UserInputError(
            "task_type='chief' needs the chief's address. Received: chief=None"
        )
    spec = parse_tf_config({"cluster": cluster,
                            "task": {"type": task_type, "index": index}})
    return spec.to_json()
