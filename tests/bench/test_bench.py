"""`mirrorkit bench`: real runs with tiny settings (no timing assertions), outputs, bad input."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import clean_env

from mirrorkit.bench.config import FIELDS, BenchConfig, BenchReport, BenchRow, Case, parse_counts
from mirrorkit.bench.output import write_report
from mirrorkit.cli import cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _row(workers: int, replicas: int, ips: float | None, eff: float | None,
         status: str = "ok", error: str = "") -> BenchRow:
    return BenchRow(workers=workers, replicas=replicas, replicas_per_worker=replicas // workers,
                    per_replica_batch=8, global_batch=8 * replicas, steps=3,
                    step_time_ms=None if ips is None else 8 * replicas / ips * 1000,
                    images_per_sec=ips, efficiency=eff,
                    strategy="mirrored" if workers == 1 else "multi_worker",
                    status=status, error=error)


# ---------------------------------------------------------------- pure functions

@pytest.mark.fast
@pytest.mark.parametrize("text, expected", [("1,2,4", (1, 2, 4)), (" 4 , 1,1", (1, 4)),
                                            ("2", (2,)), ((3, 1), (1, 3))])
def test_parse_counts(text, expected):
    assert parse_counts(text) == expected


@pytest.mark.fast
@pytest.mark.parametrize("text", ["0,x", "", "1,,2", "-1", "1.5", "two", [], [True]])
def test_parse_counts_rejects_with_the_value(text):
    with pytest.raises(ValueError, match=r"`replicas` must be a comma-separated list of "
                                         r"positive integers.*Received: replicas="):
        parse_counts(text, name="replicas")


@pytest.mark.fast
def test_config_always_measures_one_replica_and_orders_cases():
    config = BenchConfig(replicas="4,2", workers="1,3")
    assert config.cases() == (Case(1, 1), Case(1, 2), Case(1, 4), Case(3, 1))
    assert config.cases()[-1].replicas == 3


@pytest.mark.fast
@pytest.mark.parametrize("kwargs, match", [
    ({"steps": 0}, "`steps` must be a positive integer"),
    ({"per_replica_batch": -2}, "`per_replica_batch` must be a positive integer"),
    ({"threads": 0}, "`threads` must be a positive integer"),
    ({"timeout": 0}, "`timeout` must be a positive number"),
    ({"model": ""}, "`model` must be a model name"),
])
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BenchConfig(**kwargs)


@pytest.mark.fast
def test_table_and_files_from_a_constructed_report(tmp_path):
    report = BenchReport(
        config=BenchConfig(replicas=(1, 2), workers=(1, 2)),
        rows=(_row(1, 1, 1000.0, 1.0), _row(1, 2, 1500.0, 0.75), _row(2, 2, None, None,
                                                                      "failed", "worker 1 exited")),
        machine={"cores": 2, "cpu_model": "test cpu"},
    )
    table = report.table().splitlines()
    assert table[0].split()[:6] == ["workers", "replicas", "global_batch", "step_ms",
                                    "images/s", "efficiency"]
    assert table[2].split()[:6] == ["1", "2", "16", "10.67", "1500.0", "0.75"]
    assert "failed: worker 1 exited" in table[3]
    assert len(report.failed) == 1

    paths = write_report(report, tmp_path / "out")
    data = json.loads(paths["json"].read_text())
    assert set(data) == {"config", "machine", "rows"}
    assert [r["efficiency"] for r in data["rows"]] == [1.0, 0.75, None]
    rows = list(csv.DictReader(paths["csv"].open()))
    assert tuple(rows[0]) == FIELDS and rows[2]["status"] == "failed"
    assert paths["png"].read_bytes()[:8] == PNG_MAGIC


@pytest.mark.fast
def test_output_that_is_a_file_is_refused(tmp_path):
    target = tmp_path / "f"
    target.write_text("x")
    report = BenchReport(BenchConfig(), (_row(1, 1, 10.0, 1.0),), {})
    with pytest.raises(NotADirectoryError, match="--output must be a directory"):
        write_report(report, target)


def test_missing_matplotlib_still_writes_json_and_csv(tmp_path):
    # A real interpreter in which matplotlib cannot be imported (blocked by a
    # meta-path finder), so write_report takes its ImportError path for real.
    code = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ModuleNotFoundError("No module named 'matplotlib'", name=name)
sys.meta_path.insert(0, Block())
from mirrorkit.bench import BenchConfig, BenchReport, BenchRow, write_report
row = BenchRow(1, 1, 1, 8, 8, 3, 1.0, 8000.0, 1.0, "mirrored", "ok")
try:
    write_report(BenchReport(BenchConfig(), (row,), {{}}), {str(tmp_path)!r})
except ImportError as err:
    print("IMPORTERROR", err)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=clean_env(optional_packages=True), check=True).stdout
    assert 'IMPORTERROR' in out and 'pip install "mirrorkit[bench]"' in out
    assert (tmp_path / "bench.json").exists() and (tmp_path / "bench.csv").exists()
    assert not (tmp_path / "bench.png").exists()


# ---------------------------------------------------------------- CLI

@pytest.mark.fast
@pytest.mark.parametrize("args, start", [
    (["--replicas", "0,x"], "Error: `replicas` must be a comma-separated list"),
    (["--workers", "1,-2"], "Error: `workers` must be a comma-separated list"),
    (["--model", "resnet21"], "Error: "),
    (["--dataset", "digitz"], "Error: "),
])
def test_bad_input_is_one_line_and_nonzero(args, start):
    result = CliRunner().invoke(cli, ["bench", *args])
    assert result.exit_code != 0
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith(start)
    assert args[1] in lines[0]  # the message names the value received


@pytest.mark.slow
def test_bench_cnn_digits_one_and_two_replicas(tmp_path):
    """The real thing, tiny: 2 fresh processes, a few steps each, all three files."""
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "mirrorkit", "bench", "--model", "cnn", "--dataset", "digits",
         "--replicas", "1,2", "--steps", "3", "--warmup-steps", "2",
         "--per-replica-batch", "16", "--output", str(out)],
        capture_output=True, text=True, env=clean_env(optional_packages=True), timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = proc.stdout.strip().splitlines()
    assert table[0].split()[:2] == ["workers", "replicas"]
    assert [ln.split()[:3] for ln in table[1:]] == [["1", "1", "16"], ["1", "2", "32"]]
    assert all(ln.split()[-1] == "ok" for ln in table[1:])

    data = json.loads((out / "bench.json").read_text())
    assert data["config"]["model"] == "cnn" and data["config"]["replicas"] == [1, 2]
    assert {"cores", "cpu_model", "tensorflow", "keras", "date"} <= set(data["machine"])
    rows = data["rows"]
    assert [r["replicas"] for r in rows] == [1, 2]
    assert all(set(r) == set(FIELDS) for r in rows)
    # At least the 3 steps asked, in whole tf.function calls (train's default:
    # several steps per call).
    assert all(r["status"] == "ok" and r["images_per_sec"] > 0 and r["steps"] >= 3 for r in rows)
    assert rows[0]["efficiency"] == 1.0 and 0 < rows[1]["efficiency"] < 10
    assert rows[1]["global_batch"] == 32 and rows[1]["strategy"] == "mirrored"
    assert len(list(csv.DictReader((out / "bench.csv").open()))) == 2
    assert (out / "bench.png").read_bytes()[:8] == PNG_MAGIC
