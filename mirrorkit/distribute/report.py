"""The environment report behind ``mirrorkit info``.

Example:
    >>> from mirrorkit.distribute.report import environment_report
    >>> data = environment_report(simulate_cpus=2)        # doctest: +SKIP
    >>> data["replicas"]                                  # doctest: +SKIP
    2
"""

from __future__ import annotations

import platform
from typing import Any

from mirrorkit import _env
from mirrorkit._version import __version__
from mirrorkit.compat import known_issues as upstream
from mirrorkit.protocol import NETWORK_ISOLATED


def versions() -> dict[str, str | None]:
    """Versions of Python and the stack, read without importing TensorFlow.

    Example:
        >>> sorted(versions())[:2]
        ['keras', 'mirrorkit']
    """
    return {
        "python": platform.python_version(),
        "tensorflow": upstream.installed_version("tensorflow"),
        "keras": upstream.installed_version("keras"),
        "tensorflow-datasets": upstream.installed_version("tensorflow-datasets"),
        "mirrorkit": __version__,
    }


def environment_report(*, strategy: str | None = None, simulate_cpus: int | None = None,
                       probe: bool = False) -> dict[str, Any]:
    """Select the strategy as training would and describe everything found.

    Args:
        strategy: strategy kind (default: ``MIRRORKIT_STRATEGY`` or auto).
        simulate_cpus: logical CPU devices to simulate (default:
            ``MIRRORKIT_SIMULATE_CPUS`` or none).
        probe: run every fix's probe on the strategy, with Keras's own code
            and with the fixes (:func:`mirrorkit.compat.probe_report.probe_all`);
            each fix then carries ``probed``. Defaults to False.

    Returns:
        A JSON-ready dict with the keys ``python``, ``tensorflow``, ``keras``,
        ``tensorflow-datasets``, ``mirrorkit``, ``distributions`` (the
        distribution that installed each module: ``tf-nightly`` ...), ``strategy``, ``replicas``,
        ``workers``, ``task``, ``is_chief``, ``devices``,
        ``physical_devices``, ``reason``, ``cluster_source``,
        ``compat_fixes`` (each upstream fix: status, how its need was decided,
        why), ``patches`` (everything mirrorkit changes in Keras, TensorFlow
        or Python: :func:`patch_report`), ``warnings``,
        and ``slurm`` (this task's place in the step) when the cluster
        comes from a Slurm step; a multi-worker task also gets ``cluster``
        and ``listens`` (where its TensorFlow server will listen and what
        that exposes).

    Raises:
        ValueError: for a malformed ``TF_CONFIG`` or bad option.
        RuntimeError: when the strategy cannot be created.
    """
    from mirrorkit.distribute.strategy import describe, get_strategy, resolve

    sel = resolve(strategy, simulate_cpus=simulate_cpus)
    import tensorflow as tf

    physical = [f"{d.device_type}:{d.name.rsplit(':', 1)[-1]}"
                for d in tf.config.list_physical_devices()]
    if sel.kind == "multi_worker":
        # Creating a multi-worker strategy joins the cluster and blocks until
        # every peer is up; a report must not do that, so describe the plan.
        spec = sel.cluster
        runtime = {
            "strategy": "multi_worker", "replicas": None,
            "workers": spec.num_workers if spec else 1,
            "task": f"{spec.task_type}:{spec.task_index}" if spec else "worker:0",
            "is_chief": spec.is_chief if spec else True,
            "devices": [], "reason": sel.reason, "cluster_source": sel.cluster_source,
            "cluster": spec.to_dict()["cluster"] if spec else None,
            "listens": listening_note(spec.to_dict()) if spec else None,
        }
    else:
        created = get_strategy(strategy, simulate_cpus=simulate_cpus)
        rt = describe(created)
        runtime = rt.to_dict()
        runtime.pop("task_type")
        runtime.pop("task_index")
    data: dict[str, Any] = dict(versions())
    # Which distribution installed each module (tf-nightly, tensorflow-cpu, keras-nightly ...).
    data["distributions"] = {name: upstream.provider(name)
                             for name in ("tensorflow", "keras", "tensorflow-datasets")}
    data.update(runtime)
    if sel.cluster_source == "slurm":
        from mirrorkit.distribute import slurm

        task = slurm.current()
        data["slurm"] = task.describe() if task is not None else None
    data["physical_devices"] = physical
    data["logical_devices"] = [d.name for d in tf.config.list_logical_devices()]
    data["compat_fixes"] = _fixes()
    data["patches"] = patch_report()
    if probe:
        # Across workers every worker would have to probe in step: not from a report.
        from mirrorkit.compat.probe_report import describe as probe_phrase
        from mirrorkit.compat.probe_report import probe_all
        from mirrorkit.patching import PATCHES

        found = probe_all(created) if sel.kind != "multi_worker" else {}
        for patch in data["patches"]:
            if patch["name"] in found:
                record = PATCHES[patch["name"]]
                patch["probed"] = {**found[patch["name"]], "says": probe_phrase(
                    found[patch["name"]], check=bool(record.bug and record.bug.check))}
    data["warnings"] = [f"{i.ref}: {i.summary} mirrorkit: {i.handling}"
                        for i in upstream.affecting()]
    return data


def listening_note(tf_config: dict[str, Any]) -> str:
    """Where this task's TensorFlow server listens, and what that exposes.

    Example:
        >>> listening_note({"cluster": {"worker": ["a:2222", "b:2222"]},
        ...                 "task": {"type": "worker", "index": 1}}).split(":")[0]
        'every interface (0.0.0.0) of b, port 2222'
    """
    task = tf_config["task"]
    address = tf_config["cluster"][task["type"]][task["index"]]
    host, _, port = address.rpartition(":")
    if _env.get(_env.NETWORK) == NETWORK_ISOLATED:
        return (f"port {port} on the loopback of mirrorkit launch's private network namespace: "
                "not reachable from the network")
    return (f"every interface (0.0.0.0) of {host}, port {port}: TensorFlow's traffic is "
            "unauthenticated and unencrypted; use a private network or VPN and firewall "
            "the workers' ports (README: Security)")


def _fixes() -> dict[str, dict[str, str]]:
    # Which upstream fixes apply to the installed Keras, and how each knows.
    from mirrorkit import compat

    return compat.decisions()


def patch_report() -> list[dict[str, Any]]:
    """Every patch of :data:`mirrorkit.patching.PATCHES`, with its status and how that was decided.

    ``status`` is ``disabled`` (by ``MIRRORKIT_COMPAT``/``MIRRORKIT_COMPAT_DISABLE``),
    a fix's own status (``applied``, ``not-applied``, ``not-needed``,
    ``unavailable``: see :func:`mirrorkit.compat.decisions`), ``applied``
    (in force in this process) or ``inactive`` (its scope is not this
    process: ``how`` says when it is in force).

    Raises:
        ValueError: ``MIRRORKIT_COMPAT_DISABLE`` names an unknown patch.

    Example:
        >>> [p["name"] for p in patch_report()][:2]              # doctest: +SKIP
        ['symbolic-build', 'scalar-logs']
    """
    from mirrorkit import compat
    from mirrorkit.compat import allocator
    from mirrorkit.patching import PATCHES, disabled, engine

    off = disabled()
    fixes = compat.decisions()
    out = []
    for name, record in PATCHES.items():
        if name in off:
            state = {"status": "disabled", "how": "environment",
                     "detail": f"{_env.COMPAT} / {_env.COMPAT_DISABLE}"}
        elif name in fixes:
            state = {k: fixes[name][k] for k in ("status", "how", "detail")}
        elif name == allocator.NAME:
            decided = allocator.state()
            state = {"status": "not-decided" if decided == "not-applied" else decided,
                     "how": "measured",
                     "detail": "decided at the first distributed dataset, from the allocator's "
                               "own behaviour"}
        elif engine.is_applied(name):
            state = {"status": "applied", "how": "in force",
                     "detail": ", ".join(engine.in_force().get(name, []))}
        else:
            state = {"status": "inactive", "how": "scope",
                     "detail": f"in force {record.in_force_when()}"}
        out.append({**record.to_dict(), **state})
    return out
