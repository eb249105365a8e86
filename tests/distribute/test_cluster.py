"""TF_CONFIG parsing, validation and building (pure functions, no TensorFlow)."""

from __future__ import annotations

import json

import pytest

from mirrorkit.distribute.cluster import (
    build_tf_config,
    parse_address,
    parse_hosts,
    parse_tf_config,
)


def _cfg(cluster, task):
    return json.dumps({"cluster": cluster, "task": task})


GOOD = _cfg({"worker": ["localhost:2222", "localhost:2223", "localhost:2224"]},
            {"type": "worker", "index": 1})


def test_parse_good_config():
    spec = parse_tf_config(GOOD)
    assert spec.num_workers == 3
    assert (spec.task_type, spec.task_index, spec.rank) == ("worker", 1, 1)
    assert not spec.is_chief
    assert spec.address == "localhost:2223"


def test_tfjob_chief_and_workers():
    # Kubeflow TFJob: a separate chief task; it, not worker 0, is the chief.
    cluster = {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"]}
    chief = parse_tf_config(_cfg(cluster, {"type": "chief", "index": 0}))
    worker0 = parse_tf_config(_cfg(cluster, {"type": "worker", "index": 0}))
    assert chief.is_chief and not worker0.is_chief
    assert chief.num_workers == 3
    assert (chief.rank, worker0.rank) == (0, 1)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("{not json", "not valid JSON"),
        ('["a"]', "must be a JSON object"),
        (json.dumps({"task": {"type": "worker", "index": 0}}), "missing the field 'cluster'"),
        (json.dumps({"cluster": {"worker": ["a:1"]}}), "missing the field 'task'"),
        (_cfg({"worker": ["a:1"]}, {"type": "boss", "index": 0}), "task.type"),
        (_cfg({"master": ["a:1"]}, {"type": "worker", "index": 0}), "unknown task type"),
        (_cfg({"worker": ["a:1", "b:2"]}, {"type": "worker", "index": 2}), "out of range"),
        (_cfg({"worker": ["a:1"]}, {"type": "worker", "index": -1}), "out of range"),
        (_cfg({"worker": []}, {"type": "worker", "index": 0}), "non-empty list"),
        (_cfg({"worker": ["a:1", "a:1"]}, {"type": "worker", "index": 0}), "same address twice"),
        (_cfg({"worker": ["a"]}, {"type": "worker", "index": 0}), "host:port"),
        (_cfg({"worker": ["a:99999"]}, {"type": "worker", "index": 0}), "port from 1 to 65535"),
        (_cfg({"worker": ["a:0"]}, {"type": "worker", "index": 0}), "port from 1 to 65535"),
        (_cfg({"worker": [":80"]}, {"type": "worker", "index": 0}), "non-empty host"),
        (_cfg({"worker": ["a:1"]}, {"type": "worker", "index": "x"}), "must be an integer"),
        (_cfg({"worker": ["a:1"]}, {"type": "chief", "index": 0}), "does not list"),
    ],
)
def test_malformed_configs_name_the_problem(text, needle):
    with pytest.raises(ValueError, match="Received|received|twice") as err:
        parse_tf_config(text)
    assert needle in str(err.value)


def test_build_round_trips_through_parse():
    hosts = ["10.0.0.1:5000", "10.0.0.2:5000"]
    for index in range(2):
        spec = parse_tf_config(build_tf_config(hosts, index))
        assert list(spec.cluster["worker"]) == hosts
        assert spec.task_index == index
        assert spec.is_chief == (index == 0)
    text = build_tf_config(hosts, 0, task_type="chief", chief="10.0.0.9:5000")
    assert parse_tf_config(text).is_chief


def test_build_rejects_bad_hosts_and_index():
    with pytest.raises(ValueError, match="out of range"):
        build_tf_config(["a:1"], 1)
    with pytest.raises(ValueError, match="same address twice"):
        build_tf_config(["a:1", "a:1"], 0)
    with pytest.raises(ValueError, match="task_type"):
        build_tf_config(["a:1"], 0, task_type="ps")


def test_parse_hosts_and_address():
    assert parse_hosts(" a:1 ,b:2,") == ["a:1", "b:2"]
    assert parse_address("[::1]:8080") == ("::1", 8080)
    with pytest.raises(ValueError, match="at least one"):
        parse_hosts(" , ")
    with pytest.raises(ValueError, match="Received: address='a:b'"):
        parse_address("a:b")
