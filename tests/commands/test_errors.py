"""A user's mistake is one line; a bug in mirrorkit keeps its traceback and asks for a report.

Through real commands (``mirrorkit report``, ``mirrorkit tf-config``,
``mirrorkit launch``, ``mirrorkit bench``), in process with ``CliRunner`` and
as a subprocess of the real entry point. The internal errors are provoked by
making one of mirrorkit's own library functions raise; a plain ``ValueError``
(an unpacking bug) is one of them, only :class:`UserInputError` is the user's.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import click
import pytest
from click.testing import CliRunner
from conftest import clean_env

from mirrorkit.cli import cli
from mirrorkit.commands._common import USER_ERRORS, bug_reports
from mirrorkit.distribute import cluster
from mirrorkit.errors import MissingDependency, RunError, UserInputError
from mirrorkit.training import run_report

BUG_LINE = "This is a bug in mirrorkit"


@pytest.fixture
def run_dir(tmp_path):
    """A finished run's files, as `mirrorkit train` writes them (no TensorFlow needed)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps(
        {"model": "cnn", "dataset": "digits", "epochs": 1, "epochs_run": 1,
         "val_accuracy": 0.9, "val_loss": 0.3, "replicas": 1, "workers": 1}))
    (run / "history.csv").write_text("epoch,loss,accuracy\n0,0.5,0.8\n")
    return run


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.fast
def test_user_errors_are_the_explicit_types_not_bare_value_runtime_or_import_errors():
    assert {UserInputError, RunError, MissingDependency} <= set(USER_ERRORS)
    assert not {ValueError, RuntimeError, ImportError} & set(USER_ERRORS)
    # Callers that catch the builtins still catch the new types.
    assert issubclass(UserInputError, ValueError)
    assert issubclass(RunError, RuntimeError) and issubclass(MissingDependency, ImportError)

    # A plain ValueError (an unpacking bug) is none of them.
    def pair(values):
        first, second = values
        return first, second

    with pytest.raises(ValueError) as caught:
        pair((1, 2, 3))
    assert not isinstance(caught.value, USER_ERRORS)


@pytest.mark.fast
@pytest.mark.parametrize("args, start", [
    (["report", "surely/not/a/run"], "Error: Not a mirrorkit run: surely/not/a/run"),
    (["tf-config", "--workers", "a:1,b:2", "--index", "5"],
     "Error: TF_CONFIG field 'task.index' is out of range"),
    (["tf-config", "--workers", "a:1,b", "--index", "0"],
     "Error: cluster.worker[1] must be 'host:port'"),
    (["tf-config", "--workers", "a:1", "--index", "0", "--type", "chief"],
     "Error: task_type='chief' needs the chief's address"),
    (["launch", "--", "python", "x.py"], "Error: Missing -n/--nproc"),
    (["launch", "-n", "2", "--hosts", "a b", "--", "python", "x.py"],
     "Error: `hosts` entries must be HOST or HOST:PORT"),
    (["launch", "-n", "2", "--max-restarts", "0", "--min-workers", "1", "--", "python", "x.py"],
     "Error: `min_workers` (--min-workers) continues after a loss"),
    (["bench", "--replicas", "1,x"], "Error: `replicas` must be a comma-separated list"),
])
def test_a_user_mistake_is_exactly_one_line(args, start):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    assert len(_lines(result.stderr)) == 1 and result.stderr.startswith(start), result.stderr
    assert "Traceback" not in result.output and BUG_LINE not in result.output


def test_a_user_mistake_through_the_real_cli_is_one_line_and_status_1():
    proc = subprocess.run([sys.executable, "-m", "mirrorkit.cli", "report", "surely/not/a/run"],
                          capture_output=True, text=True, env=clean_env(), timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert _lines(proc.stderr) == [proc.stderr.strip()]
    assert proc.stderr.startswith("Error: Not a mirrorkit run"), proc.stderr


def test_a_usage_mistake_keeps_status_2():
    proc = subprocess.run([sys.executable, "-m", "mirrorkit.cli", "report", "--no-such-flag"],
                          capture_output=True, text=True, env=clean_env(), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert len(_lines(proc.stderr)) == 1 and "Traceback" not in proc.stderr


@pytest.mark.fast
@pytest.mark.parametrize("error", [RuntimeError("the step counter went backwards"),
                                   ImportError("cannot import name 'x' from 'mirrorkit.y'"),
                                   KeyError("epoch"),
                                   ValueError("too many values to unpack (expected 2)")])
def test_an_internal_error_shows_its_traceback_and_the_bug_line(monkeypatch, run_dir, error):
    def broken(run):
        raise error

    # summary() is mirrorkit's own code that `mirrorkit report` reaches for real.
    monkeypatch.setattr(run_report, "summary", broken)
    result = CliRunner().invoke(cli, ["report", str(run_dir)])
    assert result.exit_code == 1, result.output
    err = result.stderr
    assert err.startswith("Traceback (most recent call last):"), err
    assert "in broken" in err
    last = _lines(err)[-1]
    assert last.startswith(f"Error: {type(error).__name__}: "), last
    assert BUG_LINE in last and "mirrorkit info --json" in last
    assert not (run_dir / "report.png").exists()


@pytest.mark.fast
def test_an_unpacking_bug_inside_mirrorkit_is_a_bug_report_not_one_line(monkeypatch):
    # A real unpacking bug (not a raised stand-in) in a library function that
    # `mirrorkit tf-config` calls: a plain ValueError, so not the user's mistake.
    def parse_hosts(text):
        first, second = text.split(",")   # three hosts: too many values to unpack
        return [first, second]

    monkeypatch.setattr(cluster, "parse_hosts", parse_hosts)
    result = CliRunner().invoke(cli, ["tf-config", "--workers", "a:1,b:2,c:3", "--index", "0"])
    assert result.exit_code == 1, result.output
    err = result.stderr
    assert err.startswith("Traceback (most recent call last):"), err
    assert "in parse_hosts" in err
    assert "ValueError: too many values to unpack (expected 2)\n" in err
    last = _lines(err)[-1]
    assert last.startswith("Error: ValueError: too many values to unpack (expected 2). "
                           + BUG_LINE), last
    assert "mirrorkit info --json" in last and result.stdout == ""


@pytest.mark.fast
def test_a_user_input_error_from_the_library_stays_one_line(monkeypatch):
    # The same place raising the dedicated type is the user's mistake again.
    def parse_hosts(text):
        raise UserInputError(f"The worker list is odd. Received: workers={text!r}")

    monkeypatch.setattr(cluster, "parse_hosts", parse_hosts)
    result = CliRunner().invoke(cli, ["tf-config", "--workers", "a:1", "--index", "0"])
    assert result.exit_code == 1, result.output
    assert _lines(result.stderr) == ["Error: The worker list is odd. Received: workers='a:1'"]


def test_an_internal_error_through_the_real_entry_point(run_dir):
    code = textwrap.dedent(f"""
        from mirrorkit.training import run_report
        def broken(run):
            raise RuntimeError("the step counter went backwards")
        run_report.summary = broken
        from mirrorkit.cli import main
        main(["report", {str(run_dir)!r}])
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=clean_env(), timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("Traceback (most recent call last):") == 1, proc.stderr
    assert "RuntimeError: the step counter went backwards\n" in proc.stderr
    last = _lines(proc.stderr)[-1]
    assert last.startswith("Error: RuntimeError: the step counter went backwards. " + BUG_LINE)


def test_ctrl_c_is_one_line_and_the_status_a_shell_gives_sigint(run_dir):
    # A real SIGINT in the middle of a command: click turns it into Abort ("Aborted!",
    # status 1); a user, a shell script and a scheduler expect 130, as from Python.
    code = textwrap.dedent(f"""
        import os, signal
        from mirrorkit.training import run_report
        def interrupted(run):
            os.kill(os.getpid(), signal.SIGINT)
        run_report.summary = interrupted
        from mirrorkit.cli import main
        main(["report", {str(run_dir)!r}])
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=clean_env(), timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.returncode == 130, proc.stderr
    assert _lines(proc.stderr) == ["mirrorkit report: interrupted (Ctrl-C)"], proc.stderr


def test_a_missing_optional_package_is_one_line_with_the_pip_command(monkeypatch, run_dir):
    # A real failed import: None in sys.modules makes `import matplotlib` raise.
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    asked = run_dir.parent / "asked.png"
    result = CliRunner().invoke(cli, ["report", str(run_dir), "--png", str(asked)])
    assert result.exit_code == 1, result.output
    assert _lines(result.stderr) == [
        'Error: The report\'s PNG needs matplotlib, which is not installed: '
        'pip install "mirrorkit[bench]"'], result.stderr
    assert "Traceback" not in result.output and not asked.exists()
    # Not asked for a PNG, a base install still gets the text report, and is told.
    result = CliRunner().invoke(cli, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"run        {run_dir}"), result.stdout
    assert _lines(result.stdout)[-1] == ('skipped the plot: matplotlib is not installed '
                                         '(pip install "mirrorkit[bench]")'), result.stdout
    assert not (run_dir / "report.png").exists()


def test_clicks_own_exits_pass_through():
    with pytest.raises(click.exceptions.Exit):
        with bug_reports():
            raise click.exceptions.Exit(3)  # a RuntimeError in click, not a bug


def test_a_lost_peer_is_not_reported_as_a_bug():
    import tensorflow as tf

    # peer_loss's own excepthook turns this into its one-line account.
    lost = tf.errors.UnavailableError(None, None, "Collective ops is aborted by: The following "
                                      "tasks are unhealthy (stopped sending heartbeats):\n"
                                      "/job:worker/task:1")
    with pytest.raises(tf.errors.UnavailableError):
        with bug_reports():
            raise lost


def test_an_error_raised_inside_an_installed_library_names_it_instead_of_blaming_mirrorkit():
    import json

    from mirrorkit.commands._common import InternalError

    try:
        json.loads("{")   # stands for TensorFlow failing on a corrupt image
    except ValueError as err:
        message = InternalError(err).message
    assert "Raised inside json while mirrorkit" in message
    assert "This is a bug in mirrorkit" not in message
