"""A real single-node Slurm cluster for the tests: munged, slurmctld and slurmd as plain daemons.

These machines have no systemd, so the daemons run in the background with a
private configuration (``SLURM_CONF`` in a temporary folder; nothing under
``/etc/slurm`` is written): ``ProctrackType=proctrack/linuxproc`` and
``TaskPlugin=task/none`` need no cgroups, and the node line is what
``slurmd -C`` reports. Only root can run it (slurmd starts tasks as their
user); without root or without Debian's ``slurm-wlm`` the tests that need it
skip and say why. ``.ci/run`` installs the package.

Example:
    with SlurmCluster(tmp_path) as cluster:
        proc = cluster.run(["srun", "-n", "2", "hostname"])
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Sequence

from conftest import clean_env

BINARIES = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo")
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")


def unavailable() -> str | None:
    """Why a real Slurm cluster cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "a Slurm cluster needs root (slurmd starts tasks as their user)"
    missing = [b for b in BINARIES if shutil.which(b) is None
               and not Path("/usr/sbin", b).exists()]
    if missing:
        return (f"Slurm is not installed (missing {', '.join(missing)}); "
                "apt-get install slurm-wlm, as .ci/run does")
    return None


def _which(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class SlurmCluster:
    """Start a one-node cluster in ``root`` on entry, stop every daemon it started on exit."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.conf = self.root / "slurm.conf"
        self._started: list[Path] = []  # pid files of daemons this object started
        self._munged: subprocess.Popen | None = None

    def env(self, **extra: str) -> dict[str, str]:
        """A clean environment that talks to this cluster."""
        return clean_env(SLURM_CONF=str(self.conf), **extra)

    def run(self, command: Sequence[str], *, timeout: float = 300, cwd: Path | None = None,
            **env: str) -> subprocess.CompletedProcess:
        """Run a Slurm client command (srun, sbatch, ...) against this cluster."""
        return subprocess.run(list(command), env=self.env(**env), cwd=str(cwd or self.root),
                              capture_output=True, text=True, timeout=timeout)

    def __enter__(self) -> "SlurmCluster":
        self.root.mkdir(parents=True, exist_ok=True)
        for sub in ("ctld", "d", "log"):
            (self.root / sub).mkdir(exist_ok=True)
        node = subprocess.run([_which("slurmd"), "-C"], capture_output=True, text=True,
                              check=True).stdout.splitlines()[0]
        host = socket.gethostname().split(".")[0]
        self.conf.write_text("\n".join([
            "ClusterName=mirrorkit-tests",
            f"SlurmctldHost={host}",
            "SlurmUser=root",
            "AuthType=auth/munge",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "ReturnToService=2",
            # A fresh controller state each time: no jobs left from another run.
            f"StateSaveLocation={self.root / 'ctld'}",
            f"SlurmdSpoolDir={self.root / 'd'}",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log' / 'slurmd.log'}",
            # Ports of their own, away from a cluster the machine may already run.
            "SlurmctldPort=16817",
            "SlurmdPort=16818",
            "KillWait=5",
            f"{node} State=UNKNOWN",
            "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))
        try:
            self._start_munge()
            for daemon in ("slurmctld", "slurmd"):
                # -c: ignore saved state; both daemonise and write their pid files.
                subprocess.run([_which(daemon), "-c", "-f", str(self.conf)], check=True,
                               env=self.env(), capture_output=True, text=True, timeout=30)
                self._started.append(self.root / f"{daemon}.pid")
            self._wait_idle()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start_munge(self) -> None:
        if MUNGE_SOCKET.exists() and subprocess.run(
                ["pgrep", "-x", "munged"], capture_output=True).returncode == 0:
            return  # one is running already: share it
        MUNGE_SOCKET.parent.mkdir(parents=True, exist_ok=True)
        shutil.chown(MUNGE_SOCKET.parent, "munge", "munge")
        # setpriv execs munged as the munge user, so the child we hold is munged
        # itself and stopping it is one signal and one wait (su would sit between).
        self._munged = subprocess.Popen(
            ["setpriv", "--reuid=munge", "--regid=munge", "--init-groups",
             _which("munged"), "--foreground"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 20
        while not MUNGE_SOCKET.exists():
            if time.monotonic() > deadline or self._munged.poll() is not None:
                raise RuntimeError("munged did not start (its socket never appeared)")
            time.sleep(0.1)

    def _wait_idle(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.run(["sinfo", "-h", "-o", "%t"], timeout=10).stdout.strip()
            if state == "idle":
                return
            time.sleep(0.5)
        logs = (self.root / "log" / "slurmd.log")
        raise RuntimeError(f"the Slurm node never became idle (state {state!r}):\n"
                           + (logs.read_text()[-2000:] if logs.exists() else ""))

    def __exit__(self, *exc: object) -> None:
        pids = []
        for pid_file in reversed(self._started):
            try:
                pids.append(int(pid_file.read_text().strip()))
                os.kill(pids[-1], signal.SIGTERM)
            except (OSError, ValueError):
                pass
        self._started.clear()
        # Wait for them to go, so a cluster started next finds its ports free.
        deadline = time.monotonic() + 20
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if Path(f"/proc/{pid}").exists()
                    and "zombie" not in _state(pid)]
            time.sleep(0.2)
        if self._munged is not None:
            self._munged.terminate()
            self._munged.wait(timeout=10)
            self._munged = None


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"
