"""`mirrorkit --help`, `mirrorkit info`, and the no-TensorFlow-at-import promise."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import clean_env

from mirrorkit.cli import cli


def test_import_does_not_load_tensorflow():
    code = "import sys, mirrorkit, mirrorkit.cli; print('tensorflow' in sys.modules, 'keras' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=clean_env(), check=True).stdout.strip()
    assert out == "False False"


def test_help_lists_commands_and_does_not_load_tensorflow():
    code = ("import sys\nfrom mirrorkit.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('TF_LOADED' if 'tensorflow' in sys.modules else 'TF_FREE')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=clean_env(), check=True).stdout
    assert "info" in out and "TF_FREE" in out


def test_every_command_help_is_tensorflow_free():
    code = ("import sys\nfrom mirrorkit.cli import cli, main\n"
            "names = cli.list_commands(None)\n"
            "for name in names:\n"
            "    try:\n        main([name, '--help'])\n    except SystemExit:\n        pass\n"
            "print('COMMANDS', ','.join(names), 'TF' if 'tensorflow' in sys.modules else 'NOTF')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=clean_env(), check=True).stdout
    last = out.strip().splitlines()[-1]
    assert last.startswith("COMMANDS info") and last.endswith("NOTF")


def test_info_json_has_required_keys():
    proc = subprocess.run([sys.executable, "-m", "mirrorkit.cli", "info", "--json",
                           "--simulate-cpus", "2"], capture_output=True, text=True,
                          env=clean_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    for key in ("python", "tensorflow", "keras", "strategy", "replicas", "workers",
                "task", "is_chief", "devices", "reason"):
        assert key in data
    assert (data["strategy"], data["replicas"], data["workers"]) == ("mirrored", 2, 1)
    assert data["is_chief"] is True and len(data["devices"]) == 2
    assert "on a CPU-only machine" in data["reason"]


def test_info_describes_a_cluster_without_joining_it():
    tf_config = json.dumps({"cluster": {"worker": ["localhost:1", "localhost:2", "localhost:3"]},
                            "task": {"type": "worker", "index": 2}})
    proc = subprocess.run([sys.executable, "-m", "mirrorkit.cli", "info", "--json"],
                          capture_output=True, text=True, timeout=120,
                          env=clean_env(TF_CONFIG=tf_config))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert (data["strategy"], data["workers"], data["task"]) == ("multi_worker", 3, "worker:2")
    assert data["is_chief"] is False
    assert data["reason"] == "TF_CONFIG names 3 workers, this is worker 2"
    # Where its server will listen, and that the traffic is unauthenticated.
    assert data["listens"].startswith("every interface (0.0.0.0) of localhost, port 3: "
                                      "TensorFlow's traffic is unauthenticated")


@pytest.mark.fast
def test_info_in_an_isolated_launch_says_loopback_only(monkeypatch):
    from mirrorkit.distribute.report import listening_note

    config = {"cluster": {"worker": ["localhost:7", "localhost:8"]},
              "task": {"type": "worker", "index": 0}}
    monkeypatch.setenv("MIRRORKIT_NETWORK", "isolated")   # as mirrorkit launch sets it
    assert listening_note(config).startswith("port 7 on the loopback of mirrorkit launch's "
                                             "private network namespace")


@pytest.mark.fast
def test_malformed_tf_config_is_one_line_not_a_traceback():
    runner = CliRunner()
    for bad, needle in [("{oops", "not valid JSON"),
                        ('{"cluster": {"worker": ["a:1"]}}', "missing the field 'task'"),
                        ('{"cluster": {"worker": ["a:70000"]}, "task": {"type": "worker", "index": 0}}',
                         "port from 1 to 65535")]:
        result = runner.invoke(cli, ["info"], env={"TF_CONFIG": bad})
        assert result.exit_code != 0
        assert "Traceback" not in result.output
        lines = [ln for ln in result.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error:") and needle in lines[0]


@pytest.mark.fast
def test_bad_simulate_cpus_env_is_one_line():
    result = CliRunner().invoke(cli, ["info"], env={"MIRRORKIT_SIMULATE_CPUS": "zero"})
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip() == ("Error: MIRRORKIT_SIMULATE_CPUS must be a positive integer. "
                                     "Received: MIRRORKIT_SIMULATE_CPUS='zero'")
    result = CliRunner().invoke(cli, ["info"], env={"MIRRORKIT_STRATEGY": "tpu"})
    assert result.exit_code == 1 and "Received: MIRRORKIT_STRATEGY='tpu'" in result.output


def test_info_names_every_compat_fix_and_rejects_an_unknown_one(run_python):
    # A fresh process: the report imports TensorFlow.
    proc = run_python("""
        from click.testing import CliRunner
        from mirrorkit.cli import cli
        from mirrorkit.patching import PATCHES
        ok = CliRunner().invoke(cli, ["info"], env={"MIRRORKIT_COMPAT_DISABLE": "multi-step"})
        bad = CliRunner().invoke(cli, ["info"], env={"MIRRORKIT_COMPAT_DISABLE": "nope"})
        rows = [line.split() for line in ok.output.splitlines()
                if line.startswith(("  fix ", "  adaptation "))]
        print(ok.exit_code, [r[1] for r in rows] == list(PATCHES),
              any(r[1] == "multi-step" and r[2] == "disabled" for r in rows))
        print(bad.exit_code, bad.output.strip().splitlines()[-1])
    """)
    first, second = proc.stdout.strip().splitlines()[-2:]
    assert first == "0 True True"
    assert second.startswith("1 Error: Unknown compat fix in MIRRORKIT_COMPAT_DISABLE. "
                             "Received: nope; accepted: all, symbolic-build")


def test_info_probe_names_each_fixs_finding_on_two_replicas():
    # The text every user reads, and the probes run twice: Keras alone, then the fixes.
    proc = subprocess.run([sys.executable, "-m", "mirrorkit", "info", "--simulate-cpus", "2",
                           "--probe"], capture_output=True, text=True, env=clean_env(),
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    fixes = {line.split()[1]: line for line in proc.stdout.splitlines()
             if line.startswith("  fix ") and "version table" in line}
    assert fixes, proc.stdout
    assert all("; probe: " in line for line in fixes.values()), proc.stdout
    assert "bug shown with Keras alone, gone with the fix" in fixes["symbolic-build"]
    assert "bug shown with Keras alone, gone with the fix" in fixes["scalar-losses"]
    # A bug that only shows across workers cannot be probed in one process: said so.
    assert "cannot tell here" in fixes["scalar-logs"]
    assert not any("STILL THERE" in line for line in fixes.values()), proc.stdout
