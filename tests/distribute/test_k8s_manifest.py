"""``apps/k8s/tfjob.yaml`` is a valid Kubeflow TFJob whose pods mirrorkit understands.

Parsed as YAML (not grepped): the API version and kind, one chief and N
workers, the container name and port the training operator expects, a
restart policy it accepts, a command line ``mirrorkit train`` accepts, and the
TF_CONFIG the operator writes for those replicas -- the one the manifest's
header shows -- read by mirrorkit as the intended cluster (chief:0 the
chief, 1 + N workers, the container's port).
"""

from __future__ import annotations

import json
import re
import shlex

import pytest
import yaml
from conftest import REPO

from mirrorkit.distribute.cluster import parse_tf_config

MANIFEST = REPO / "apps" / "k8s" / "tfjob.yaml"
# What the Kubeflow training operator requires or accepts (kubeflow.org/v1 TFJob).
RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}
PORT_NAME = "tfjob-port"
CONTAINER = "tensorflow"


@pytest.fixture(scope="module")
def job() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


def _container(spec: dict) -> dict:
    containers = spec["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == [CONTAINER]
    return containers[0]


def _operator_tf_config(job: dict, task_type: str, index: int, namespace: str) -> dict:
    """TF_CONFIG as the operator writes it: <job>-<type>-<i>.<ns>.svc:<port> per replica."""
    name, cluster = job["metadata"]["name"], {}
    for kind, spec in job["spec"]["tfReplicaSpecs"].items():
        port = _container(spec)["ports"][0]["containerPort"]
        cluster[kind.lower()] = [f"{name}-{kind.lower()}-{i}.{namespace}.svc:{port}"
                                 for i in range(spec["replicas"])]
    return {"cluster": cluster, "task": {"type": task_type, "index": index}}


def test_it_is_a_tfjob_with_one_chief_and_workers(job):
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "TFJob")
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", job["metadata"]["name"])
    specs = job["spec"]["tfReplicaSpecs"]
    assert set(specs) == {"Chief", "Worker"}
    assert specs["Chief"]["replicas"] == 1 and specs["Worker"]["replicas"] >= 1
    assert job["spec"]["runPolicy"]["backoffLimit"] >= 1
    for spec in specs.values():
        assert spec["restartPolicy"] in RESTART_POLICIES
        container = _container(spec)
        assert container["ports"] == [{"name": PORT_NAME, "containerPort": 2222}]
        assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
        # The run directory is shared: every pod mounts the same claim at the same path.
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
        assert set(mounts) <= set(volumes)
        env = {e["name"]: e["value"] for e in container["env"]}
        assert any(env["RUN_DIR"].startswith(path) for path in mounts.values())


def test_every_pod_runs_a_command_line_mirrorkit_train_accepts(job):
    from mirrorkit.commands.train import train

    for kind, spec in job["spec"]["tfReplicaSpecs"].items():
        container = _container(spec)
        assert container["command"] == ["sh", "-c"]
        script = " ".join(container["args"])
        env = {e["name"]: e["value"] for e in container["env"]}
        # The shell part: `exec mirrorkit train ... $([ -d backup ] && echo --resume)`.
        resume = re.search(r"\$\(\[ -d \"\$RUN_DIR/backup\" \] && echo --resume\)", script)
        assert resume, f"{kind}: restarted pods must resume from the backup: {script}"
        words = shlex.split(script[:resume.start()].replace("$RUN_DIR", env["RUN_DIR"]))
        assert words[:3] == ["exec", "mirrorkit", "train"], words
        for extra in ([], ["--resume"]):
            context = train.make_context("train", words[3:] + extra)  # raises on a bad option
            assert context.params["output"] == env["RUN_DIR"]


def test_the_operators_tf_config_is_the_cluster_mirrorkit_reads(job):
    workers = job["spec"]["tfReplicaSpecs"]["Worker"]["replicas"]
    chief = parse_tf_config(_operator_tf_config(job, "chief", 0, "ns"))
    assert chief.is_chief and chief.num_workers == 1 + workers
    for index in range(workers):
        worker = parse_tf_config(_operator_tf_config(job, "worker", index, "ns"))
        assert not worker.is_chief and worker.num_workers == 1 + workers
    # The header's example TF_CONFIG (first worker) is the one the operator writes.
    header = "".join(line[1:].strip() for line in MANIFEST.read_text().splitlines()
                     if line.startswith("#   {") or line.startswith("#    "))
    shown = json.loads(header.replace("<ns>", "ns"))
    assert shown == _operator_tf_config(job, "worker", 0, "ns")
