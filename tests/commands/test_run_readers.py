"""Every reader of run files validates what it reads (issue 30): report, export-model, worker status.

Each case writes a real run folder (or status folder) with one bad field,
first shows what the unchecked code does with it (the issue's traceback or
wrong line), then runs the real command: one line naming the file, the
field and the value, a non-zero exit, nothing printed before it, and no
file of the run changed.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import shutil
import subprocess
import sys
import zipfile

import pytest
from click.testing import CliRunner
from conftest import clean_env

from mirrorkit.cli import cli
from mirrorkit.training import run_report

HISTORY = ("epoch,accuracy,loss,val_accuracy,val_loss\n"
           "0,0.50,1.50,0.70,0.90\n1,0.80,0.60,0.85,0.45\n2,0.90,0.30,0.93,0.25\n")
METRICS = {"model": "cnn", "dataset": "digits", "epochs": 3, "epochs_run": 3,
           "initial_epoch": 0, "optimizer": "adam", "learning_rate": 0.002,
           "precision": "float32", "strategy": "mirrored", "replicas": 2, "workers": 1,
           "per_replica_batch": 32, "global_batch": 64, "accumulate": 1,
           "val_accuracy": 0.93, "val_loss": 0.25, "wall_time_seconds": 12.5,
           "images_per_second": 900.0, "images_per_second_per_replica": 450.0,
           "images_per_second_by_epoch": [800.0, 900.0, 1000.0]}
ROLLBACK = {"kind": "rollback", "rollback": 1, "epoch": 2, "step": 14, "cause": "nan",
            "loss": "nan", "restored_epoch": 1, "learning_rate": 0.001}
PER_WORKER = {"epoch": 1, "step_ms": 40.0, "worker_step_ms": [10.0, 32.0],
              "stragglers": [[1, 3.2]]}


def _run(path, metrics_text=None, history=HISTORY, **extra):
    path.mkdir(parents=True)
    (path / "metrics.json").write_text(metrics_text if metrics_text is not None
                                       else json.dumps({**METRICS, **extra}))
    if history is not None:
        (path / "history.csv").write_text(history)
    return path


def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _report(*args):
    result = CliRunner().invoke(cli, ["report", *map(str, args)])
    return result, result.stderr.strip().splitlines()


# --- metrics.json: the issue's wrong types ------------------------------------------------------

ISSUE_CASES = [
    ({"accumulate": "abc"}, TypeError,
     "`accumulate` must be an integer >= 1 or null. Received: accumulate='abc'"),
    ({"incidents": "abc"}, AttributeError,
     "`incidents` must be a list of JSON objects or null. Received: incidents='abc'"),
    ({"per_worker": "abc"}, AttributeError,
     "`per_worker` must be a list of JSON objects or null. Received: per_worker='abc'"),
    ({"initial_epoch": [1]}, TypeError,
     "`initial_epoch` must be an integer >= 0 or null. Received: initial_epoch=[1]"),
    # Unchecked, a ValueError too, but its line names neither the file nor the field.
    ({"initial_epoch": "abc"}, ValueError,
     "`initial_epoch` must be an integer >= 0 or null. Received: initial_epoch='abc'"),
]


@pytest.mark.fast
@pytest.mark.parametrize("extra, upstream, line", ISSUE_CASES,
                         ids=["accumulate", "incidents", "per_worker", "initial_epoch-list",
                              "initial_epoch-text"])
def test_a_wrong_type_in_metrics_json_is_one_line_naming_file_field_and_value(
        tmp_path, extra, upstream, line):
    run = _run(tmp_path / "run", **extra)
    before = _digest(run)
    # The failure: the summary reads the unchecked field and breaks deep inside.
    unchecked = run_report.Run(run, {**METRICS, **extra}, [])
    with pytest.raises(upstream) as failure:
        run_report.summary(unchecked)
    assert "metrics.json" not in str(failure.value)
    result, err = _report(run)
    assert result.exit_code == 1, result.output
    assert err == [f"Error: {run}/metrics.json: {line}"]
    assert result.stdout == "" and "Traceback" not in result.output
    assert _digest(run) == before


@pytest.mark.fast
@pytest.mark.parametrize("extra, line", [
    ({"incidents": [{**ROLLBACK, "cause": None}]},
     "`incidents[0].cause` must be a string. Received: incidents[0].cause=None"),
    ({"incidents": [{k: v for k, v in ROLLBACK.items() if k != "step"}]},
     "`incidents[0]` lacks step (it has cause, epoch, kind, learning_rate, loss, "
     "restored_epoch, rollback)"),
    ({"incidents": [{**ROLLBACK, "loss": "low"}]},
     "`incidents[0].loss` must be a number or one of nan, inf, -inf. "
     "Received: incidents[0].loss='low'"),
    ({"incidents": [{**ROLLBACK, "kind": "reboot"}]},
     "`incidents[0].kind` must be 'rollback' or 'membership'. Received: incidents[0].kind='reboot'"),
    ({"per_worker": [{**PER_WORKER, "worker_step_ms": [10.0, 0]}]},
     "`per_worker[0].worker_step_ms[1]` must be a number > 0. "
     "Received: per_worker[0].worker_step_ms[1]=0"),
    ({"per_worker": [{**PER_WORKER, "stragglers": [[5, 3.2]]}]},
     "`per_worker[0].stragglers[0]` must be [worker index below 2, ratio]. "
     "Received: per_worker[0].stragglers[0]=[5, 3.2]"),
    ({"targets": [{"target": "val_accuracy>=0.9", "value": 0.93, "met": "yes"}]},
     "`targets[0].met` must be true or false. Received: targets[0].met='yes'"),
    ({"weights_in_sync": {"workers": 0, "identical": True}},
     "`weights_in_sync.workers` must be an integer >= 1. Received: weights_in_sync.workers=0"),
    ({"val_accuracy": 3}, "`val_accuracy` must be a number (NaN allowed) in [0, 1] or null. "
     "Received: val_accuracy=3"),
    ({"global_batch": True}, "`global_batch` must be an integer >= 1 or null. "
     "Received: global_batch=True"),
    ({"images_per_second_by_epoch": [800.0, -1, 1000.0]},
     "`images_per_second_by_epoch[1]` must be a number >= 0. "
     "Received: images_per_second_by_epoch[1]=-1"),
    ({"model": "x" * 100}, None),   # a long string is fine, only its type is checked
])
def test_every_field_the_report_uses_is_checked(tmp_path, extra, line):
    run = _run(tmp_path / "run", **extra)
    result, err = _report(run, "--png", tmp_path / "r.png")
    if line is None:
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code == 1, result.output
    assert err == [f"Error: {run}/metrics.json: {line}"]
    assert result.stdout == "" and not (tmp_path / "r.png").exists()


@pytest.mark.fast
@pytest.mark.parametrize("text, line", [
    ("[1, 2]", "must hold a JSON object (what `mirrorkit train` writes). Received: list [1, 2]"),
    ("[" * 5000 + "]" * 5000, "is not valid JSON (maximum recursion depth exceeded"),
    (b"\xff\xfe{}", "is not valid JSON ('utf-8' codec can't decode byte 0xff in position 0"),
])
def test_a_metrics_json_that_is_not_an_object_of_utf8_json_is_one_line(tmp_path, text, line):
    run = _run(tmp_path / "run", metrics_text="")
    (run / "metrics.json").write_bytes(text.encode() if isinstance(text, str) else text)
    result, err = _report(run)
    assert result.exit_code == 1 and len(err) == 1, result.output
    assert err[0].startswith(f"Error: {run}/metrics.json ") and line in err[0], err[0]
    assert "Traceback" not in result.output


# --- history.csv and events.jsonl ---------------------------------------------------------------

FUSED = ("epoch,accuracy,loss,val_accuracy,val_loss\n"
         "0,0.50,1.50,0.70,0.901,0.80,0.60,0.85,0.45\n2,0.90,0.30,0.93,0.25\n")


@pytest.mark.fast
def test_two_history_rows_fused_on_one_line_are_named_not_plotted_wrong(tmp_path):
    run = _run(tmp_path / "run", history=FUSED)
    before = _digest(run)
    # The failure: read as before (non-numbers dropped), the plot gets 2 epochs and 3 rates.
    with open(run / "history.csv", newline="") as f:
        rows = [{k: float(v) for k, v in row.items() if isinstance(v, str)}
                for row in csv.DictReader(f)]
    with pytest.raises(ValueError, match="x and y must have same first dimension"):
        run_report.plot([run_report.Run(run, METRICS, rows)], tmp_path / "old.png")
    result, err = _report(run)
    assert result.exit_code == 1
    assert err == [f"Error: {run}/history.csv line 2 has 9 fields, the header has 5 "
                   "(epoch,accuracy,loss,val_accuracy,val_loss): two rows fused on one line or "
                   "a row cut short. Fix or delete that line."]
    assert result.stdout == "" and _digest(run) == before


@pytest.mark.fast
@pytest.mark.parametrize("history, line", [
    (HISTORY.replace("0.60", "abc"), "history.csv line 3: `loss` must be a number or NA. "
                                     "Received: loss='abc'"),
    (HISTORY.replace("\n1,", "\n1.5,"), "history.csv line 3: `epoch` must be a whole number "
                                        ">= 0. Received: epoch='1.5'"),
    (HISTORY.replace("0.60", "0.6\0"), "history.csv line 3: `loss` must be a number or NA. "
                                        "Received: loss='0.6\\x00'"),
    # Rows lost (not fused): more epochs measured than rows.
    (HISTORY.rsplit("2,", 1)[0], "history.csv has 2 epoch row(s) but "),
])
def test_a_bad_history_csv_is_one_line(tmp_path, history, line):
    run = _run(tmp_path / "run", history=history)
    result, err = _report(run)
    assert result.exit_code == 1 and len(err) == 1, result.output
    assert err[0].startswith(f"Error: {run}/history.csv") and line in err[0], err[0]


@pytest.mark.fast
def test_na_values_are_gaps_and_a_run_without_history_still_plots(tmp_path):
    na = _run(tmp_path / "na", history=HISTORY.replace("0.85,0.45", "NA,NA"))
    bare = _run(tmp_path / "bare", history=None)
    result, _ = _report(na, bare, "--png", tmp_path / "both.png")
    assert result.exit_code == 0, result.output
    assert "val_loss -  val_accuracy -" in result.stdout
    assert (tmp_path / "both.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.fast
@pytest.mark.parametrize("text, line", [
    ('{"event": "restart", "attempt": "two", "reason": "x"}\n',
     "events.jsonl: `restart.attempt` must be an integer >= 1. Received: restart.attempt='two'"),
    (b'{"event": "run_start"}\n\xff\n', "events.jsonl cannot be read as an event log ('utf-8'"),
])
def test_a_bad_event_log_is_one_line(tmp_path, text, line):
    run = _run(tmp_path / "run")
    (run / "events.jsonl").write_bytes(text.encode() if isinstance(text, str) else text)
    result, err = _report(run)
    assert result.exit_code == 1 and len(err) == 1, result.output
    assert err[0].startswith(f"Error: {run}/events.jsonl") and line in err[0], err[0]


# --- where the PNG goes -------------------------------------------------------------------------

@pytest.mark.fast
def test_a_png_path_that_cannot_be_is_refused_before_anything_is_printed(tmp_path):
    run = _run(tmp_path / "run")
    result, err = _report(run, "--png", tmp_path / "no" / "such" / "r.png")
    assert result.exit_code == 1 and result.stdout == ""
    assert err == [f"Error: --png's folder '{tmp_path}/no/such' does not exist; create it or "
                   f"pick another path. Received: --png='{tmp_path}/no/such/r.png'"]


@pytest.mark.fast
def test_a_png_that_cannot_be_written_goes_to_a_temporary_folder_and_the_old_one_stays(tmp_path):
    run = _run(tmp_path / "run")
    # report.png is a folder here, so writing it fails as on a read-only disk.
    (run / "report.png").mkdir()
    (run / "report.png" / "keep").write_text("mine")
    result, err = _report(run)
    assert result.exit_code == 0, result.output
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("wrote /") and f"report.png instead: {run} is not writable (" in last
    moved = last.split()[1]
    assert open(moved, "rb").read(4) == b"\x89PNG"
    assert (run / "report.png" / "keep").read_text() == "mine"
    assert not [p for p in run.iterdir() if p.name.endswith(".partial")]
    shutil.rmtree(moved.rsplit("/", 1)[0])


def _read_only(folder, *command):
    """``command`` run with ``folder`` mounted read-only (a user+mount namespace, no root)."""
    script = 'mount --bind -o ro "$0" "$0" && exec "$@"'
    return subprocess.run(["unshare", "-rm", "sh", "-c", script, str(folder), *command],
                          capture_output=True, text=True, timeout=120,
                          env=clean_env(optional_packages=True))   # draws a PNG


def test_on_a_read_only_run_folder_the_report_prints_and_the_png_goes_elsewhere(tmp_path):
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("no unprivileged user namespaces here to mount a folder read-only")
    run = _run(tmp_path / "run")
    before = _digest(run)
    # The failure: drawing into the read-only folder, as the report always did.
    control = _read_only(run, sys.executable, "-c",
                         "import sys; from mirrorkit.training.run_report import load_run, plot\n"
                         "plot([load_run(sys.argv[1])], sys.argv[1] + '/report.png')", str(run))
    assert control.returncode == 1 and "Read-only file system" in control.stderr
    proc = _read_only(run, sys.executable, "-m", "mirrorkit", "report", str(run))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    out = proc.stdout.strip().splitlines()
    assert out[0] == f"run        {run}" and any(line.startswith("epoch    3") for line in out)
    assert out[-1].startswith("wrote /") and out[-1].endswith(
        f"/report.png instead: {run} is not writable (Read-only file system)")
    moved = out[-1].split()[1]
    assert open(moved, "rb").read(4) == b"\x89PNG"
    assert _digest(run) == before and not (run / "report.png").exists()
    shutil.rmtree(moved.rsplit("/", 1)[0])


# --- export-model: what is not a whole Keras archive (before TensorFlow loads) ----------------

def _zip(members):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


KERAS = {"config.json": "{}", "metadata.json": "{}", "model.weights.h5": b"w" * 4000}
REMEDY = (" Train again, or continue with `mirrorkit train --resume --output RUN_DIR` if the "
          "run kept its backup/.")


def _damaged():
    data = bytearray(_zip(KERAS))
    data[data.index(b"w" * 100) + 50] = ord("x")   # one byte of the weights changed
    return bytes(data)


@pytest.mark.fast
@pytest.mark.parametrize("content, says", [
    (b"", "is empty (0 bytes): the save that wrote it did not finish." + REMEDY),
    (_zip(KERAS)[:2000], "is truncated (a zip archive cut short at 2000 bytes)." + REMEDY),
    (b"\x89HDF\r\n\x1a\n" + b"\0" * 100, "is not a Keras archive (a .keras file is a zip "
     "archive; this one starts with b'\\x89HDF')." + REMEDY),
    (_zip({"saved_model.pb": "x"}), "is not a Keras archive: a zip without config.json, "
     "metadata.json."),
    (_damaged(), "is damaged: model.weights.h5 fails its checksum." + REMEDY),
], ids=["empty", "truncated", "h5", "foreign-zip", "damaged"])
def test_export_model_names_an_empty_truncated_or_foreign_model_keras(tmp_path, content, says):
    run = tmp_path / "run"
    run.mkdir()
    (run / "model.keras").write_bytes(content)
    result = CliRunner().invoke(cli, ["export-model", str(run)])
    assert result.exit_code == 1, result.output
    assert result.stderr.strip().splitlines() == [f"Error: {run}/model.keras {says}"]
    assert not (run / "saved_model").exists() and (run / "model.keras").read_bytes() == content


# --- the launcher's worker status files ---------------------------------------------------------

GOOD = {"version": 1, "rank": 0, "epoch": 2, "step_ms": 40.0, "images_per_second": 800.0,
        "local_step_ms": 10.0}


@pytest.mark.fast
def test_the_status_reader_skips_unreadable_or_implausible_files_with_one_warning_each(
        tmp_path, caplog):
    from mirrorkit import protocol
    from mirrorkit.launcher import worker_status

    (tmp_path / "worker-0.json").write_text(json.dumps(GOOD))
    (tmp_path / "worker-1.json").write_text("[" * 20000 + "]" * 20000)
    (tmp_path / "worker-2.json").write_bytes(b"\xff\xfe{}")
    (tmp_path / "worker-3.json").write_text(json.dumps({**GOOD, "rank": 3,
                                                        "images_per_second": 1e308}))
    (tmp_path / "worker-4.json").write_text(json.dumps({**GOOD, "rank": 4, "epoch": 0}))
    (tmp_path / "worker-5.json").write_text(json.dumps({**GOOD, "rank": 5,
                                                        "local_step_ms": 1e-320}))
    (tmp_path / "worker-6.json").write_text(" " * 70_000 + json.dumps({**GOOD, "rank": 6}))
    (tmp_path / "worker-07.json").write_text(json.dumps({**GOOD, "rank": 7}))
    (tmp_path / "worker-7.json").write_text(json.dumps({**GOOD, "rank": 7}))
    # The failure: the schema alone lets a nested file crash the launcher's summary
    # (RecursionError is no ValueError) and lets 1e308 images/s through.
    with pytest.raises(RecursionError):
        protocol.read_status(tmp_path / "worker-1.json")
    assert protocol.read_status(tmp_path / "worker-3.json")["images_per_second"] == 1e308
    with caplog.at_level(logging.WARNING, logger="mirrorkit.launcher.worker_status"):
        statuses = worker_status.read(tmp_path)
    assert [s["rank"] for s in statuses] == [0, 5, 7]
    warnings = [r.getMessage() for r in caplog.records]
    assert all("\n" not in w and w.startswith("skipping a worker's status: ") for w in warnings)
    for name, what in [("worker-1.json", "JSON nested too deeply to read"),
                       ("worker-2.json", "is not UTF-8 text (invalid start byte at byte 0)"),
                       ("worker-3.json", "`images_per_second` must be at most 1e+09. "
                                         "Received: images_per_second=1e+308"),
                       ("worker-4.json", "`epoch` must be at least 1. Received: epoch=0"),
                       ("worker-6.json", "is 70,"),
                       ("worker-7.json", "is a second file for rank 7")]:
        assert any(name in w and what in w for w in warnings), (name, warnings)
    assert len(warnings) == 6
    lines = worker_status.lines(statuses)
    # Worker 5's sub-microsecond local step is no measurement: no "infx" straggler line.
    assert lines[1] == "worker 5: 800 images/s (epoch 2)"
    assert not any("inf" in line for line in lines)


def test_a_launched_workers_bad_status_file_is_a_warning_and_the_job_goes_on(tmp_path):
    writer = ("import os, pathlib\n"
              "folder = pathlib.Path(os.environ['MIRRORKIT_STATUS_DIR'])\n"
              "(folder / 'worker-0.json').write_text('[' * 20000 + ']' * 20000)\n")
    proc = subprocess.run([sys.executable, "-m", "mirrorkit", "launch", "-n", "1", "--",
                           sys.executable, "-c", writer], capture_output=True, text=True,
                          env=clean_env(), timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "worker-0.json" in line]
    assert len(said) == 1 and "skipping a worker's status" in said[0], proc.stderr
    assert "JSON nested too deeply to read" in said[0] and "Traceback" not in proc.stderr
