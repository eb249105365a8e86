"""Shared fixtures: fresh-subprocess Python runs, free loopback ports.

Device splits and multi-worker collectives are per process and permanent, so
every multi-device case runs in a fresh interpreter through ``run_python``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment minus anything that steers mirrorkit."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MIRRORKIT_", "SLURM_")) and k != "TF_CONFIG"}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra)
    return env


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports that were free a moment ago."""
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def consecutive_free_ports(n: int) -> int:
    """A base port ``p`` with ``p .. p+n-1`` all free a moment ago."""
    for _ in range(100):
        base = free_ports(1)[0]
        if base + n > 65535:
            continue
        socks = []
        try:
            for port in range(base, base + n):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {n} consecutive free ports found")



@pytest.fixture
def run_python(tmp_path):
    """Run a Python snippet in a fresh interpreter; return CompletedProcess.

    Example:
        proc = run_python("print(1)", env={"MIRRORKIT_SIMULATE_CPUS": "2"})
    """

    def _run(code: str, *, env: dict[str, str] | None = None, timeout: float = 300,
             check: bool = True) -> subprocess.CompletedProcess:
        script = tmp_path / f"snippet_{abs(hash(code))}.py"
        script.write_text(textwrap.dedent(code))
        proc = subprocess.run([sys.executable, str(script)], env=clean_env(**(env or {})),
                              capture_output=True, text=True, timeout=timeout,
                              cwd=str(tmp_path))
        if check and proc.returncode != 0:
            raise AssertionError(f"snippet failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    return _run


def result_line(stdout: str, tag: str = "RESULT ") -> dict:
    """Parse the JSON a snippet printed after ``tag`` (the last such line)."""
    lines = [x for x in stdout.splitlines() if x.startswith(tag)]
    assert lines, f"no {tag.strip()} line in:\n{stdout}"
    return json.loads(lines[-1][len(tag):])


def run_snippet(code: str, directory: Path, *, env: dict[str, str] | None = None,
                timeout: float = 300) -> tuple[dict, subprocess.CompletedProcess]:
    """Run ``code`` as a script in a fresh interpreter; return (RESULT json, process).

    The snippet reports by printing ``RESULT <json>``; a non-zero exit fails the test
    with the snippet's output, so a broken feature shows its own error.
    """
    script = directory / "snippet.py"
    script.write_text(textwrap.dedent(code))
    # The tests folder is importable so snippets can use snippet_helpers.
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "tests"),
                                                        os.environ.get("PYTHONPATH")])),
           **(env or {})}
    proc = subprocess.run([sys.executable, str(script)], env=clean_env(**env),
                          capture_output=True, text=True, timeout=timeout, cwd=str(directory))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return result_line(proc.stdout), proc


def conv_mis_shapes_empty_batches() -> bool:
    """Does this CPU show TensorFlow's oneDNN empty-batch convolution bug? (the fix's own probe)

    oneDNN picks its kernels by instruction set: on CPUs without AVX2 empty
    batches come out right and the upstream failure cannot show.
    """
    code = "from mirrorkit.compat import empty_conv; print(empty_conv._kernel_is_broken())"
    proc = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1] == "True"
