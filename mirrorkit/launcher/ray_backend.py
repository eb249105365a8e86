"""Ray Train's TensorFlow set-up, without TensorFlow in Ray's processes.

Ray Train's ``TensorflowTrainer`` does one thing for TensorFlow: before the
training function runs, its backend gives every worker actor a ``TF_CONFIG``
listing all the workers' addresses (the node's IP and a free port) and its
own index. But its package imports TensorFlow first, and so does every
process that unpickles its backend: the driver, Ray Train's controller and
each worker actor. mirrorkit never uses TensorFlow there -- the program each
actor starts imports its own -- so every such process paid a TensorFlow
start (3-4 CPU-s and several hundred MB of memory that stay for the job) for
nothing. :class:`TFConfigBackend` sets the same ``TF_CONFIG`` (without Ray's
``TF_USE_LEGACY_KERAS=1``, which mirrorkit removes from its workers anyway),
and :func:`trainer_class` is the Ray Train ``DataParallelTrainer`` that
``TensorflowTrainer`` itself derives from (Ray Train v2 unless
``RAY_TRAIN_V2_ENABLED=0`` selects v1, as Ray's own package does).

Example:
    >>> json.loads(tf_config(["10.0.0.1:5001", "10.0.0.2:5002"], 1))["task"]
    {'type': 'worker', 'index': 1}
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any, Sequence

try:
    from ray.train.backend import Backend, BackendConfig
except ImportError:  # a base install: `mirrorkit launch --ray` names the extra to install
    Backend = BackendConfig = object


def tf_config(addresses: Sequence[str], index: int) -> str:
    """The ``TF_CONFIG`` of worker ``index`` among ``addresses`` (as Ray Train writes it).

    Example:
        >>> json.loads(tf_config(["a:1", "b:2"], 0))["cluster"]
        {'worker': ['a:1', 'b:2']}
    """
    return json.dumps({"cluster": {"worker": list(addresses)},
                       "task": {"type": "worker", "index": index}})


def _address() -> str:
    # Runs in each worker actor: its node's address and a port free a moment ago.
    import ray

    ip = ray.util.get_node_ip_address()
    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _set_tf_config(addresses: Sequence[str], index: int) -> None:
    os.environ["TF_CONFIG"] = tf_config(addresses, index)


class _Backend(Backend):
    """Sets every worker's ``TF_CONFIG`` when Ray Train starts (or restarts) the group."""

    def on_start(self, worker_group: Any, backend_config: "TFConfigBackend") -> None:
        import ray

        addresses = worker_group.execute(_address)
        ray.get([worker_group.execute_single_async(i, _set_tf_config, addresses, i)
                 for i in range(len(worker_group))])


class TFConfigBackend(BackendConfig):
    """The ``backend_config`` that gives Ray Train's workers their ``TF_CONFIG``.

    Example:
        >>> TFConfigBackend().backend_cls.__name__
        '_Backend'
    """

    @property
    def backend_cls(self) -> type:
        return _Backend


def trainer_class() -> type:
    """Ray Train's ``DataParallelTrainer``: v2 unless ``RAY_TRAIN_V2_ENABLED=0``.

    Example:
        >>> trainer_class().__name__                # doctest: +SKIP
        'DataParallelTrainer'
    """
    try:
        from ray.train.v2._internal.constants import is_v2_enabled
    except ImportError:  # a Ray without Train v2
        return _v1()
    if not is_v2_enabled():
        return _v1()
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
    return DataParallelTrainer


def _v1() -> type:
    from ray.train.data_parallel_trainer import DataParallelTrainer
    return DataParallelTrainer
