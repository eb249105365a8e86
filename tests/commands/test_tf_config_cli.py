"""``mirrorkit tf-config``: output round-trips through parse_tf_config; bad input is one line."""

from __future__ import annotations

import shlex

import pytest
from click.testing import CliRunner

from mirrorkit.cli import cli
from mirrorkit.distribute.cluster import parse_tf_config


def _run(*args: str):
    return CliRunner().invoke(cli, ["tf-config", *args])


@pytest.mark.parametrize("n", [2, 3])
def test_every_index_round_trips(n):
    hosts = [f"localhost:{12345 + i}" for i in range(n)]
    for index in range(n):
        result = _run("--workers", ",".join(hosts), "--index", str(index))
        assert result.exit_code == 0, result.output
        assert result.output.count("\n") == 1  # one line, easy to paste or $(...)
        spec = parse_tf_config(result.output)
        assert spec.cluster == {"worker": tuple(hosts)}
        assert (spec.task_type, spec.task_index, spec.num_workers) == ("worker", index, n)
        assert spec.is_chief == (index == 0)


def test_spaces_around_hosts_are_ignored():
    result = _run("--workers", " a:1 , b:2 ", "--index", "1")
    assert result.exit_code == 0, result.output
    assert parse_tf_config(result.output).cluster == {"worker": ("a:1", "b:2")}


def test_export_is_a_shell_line_with_the_same_json():
    plain = _run("--workers", "h1:2222,h2:2222", "--index", "1").output.strip()
    line = _run("--workers", "h1:2222,h2:2222", "--index", "1", "--export").output.strip()
    words = shlex.split(line)
    assert words[0] == "export" and words[1] == f"TF_CONFIG={plain}"


def test_separate_chief():
    chief = _run("--workers", "w0:1,w1:1", "--chief", "c:1", "--type", "chief", "--index", "0")
    worker = _run("--workers", "w0:1,w1:1", "--chief", "c:1", "--index", "1")
    assert chief.exit_code == 0 and worker.exit_code == 0, chief.output + worker.output
    c, w = parse_tf_config(chief.output), parse_tf_config(worker.output)
    assert c.cluster == w.cluster == {"chief": ("c:1",), "worker": ("w0:1", "w1:1")}
    assert c.is_chief and not w.is_chief and c.num_workers == 3 and w.rank == 2


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--workers", "localhost:1,localhost", "--index", "0"], "must be 'host:port'"),
        (["--workers", "a:1,b:99999", "--index", "0"], "port from 1 to 65535"),
        (["--workers", "a:1,a:1", "--index", "0"], "same address twice"),
        (["--workers", "a:1,b:2", "--index", "2"], "out of range"),
        (["--workers", "a:1,b:2", "--index", "-1"], "out of range"),
        (["--workers", ",", "--index", "0"], "at least one 'host:port'"),
        (["--workers", "a:1", "--type", "chief", "--index", "0"], "chief's address"),
        (["--workers", "a:1", "--chief", "a:1", "--type", "chief", "--index", "0"],
         "same address twice"),
    ],
)
def test_bad_input_is_one_clear_line(args, expected):
    result = _run(*args)
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert expected in lines[0]
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)  # click's exit, not a crash


def test_missing_required_options_is_a_usage_error():
    result = _run("--workers", "a:1")
    assert result.exit_code == 2 and "--index" in result.output
