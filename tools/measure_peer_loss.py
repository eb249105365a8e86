"""Measure how fast a lost peer is noticed, and restarted from, between two network hosts.

Makes two hosts (network namespaces on a bridge, ``tests/netns_hosts.py``;
root only), starts ``mirrorkit launch -n 1 --hosts hosta,hostb`` on each with
the small training script of the tests, and after two epochs injects a fault
on host B: its worker killed (``kill``), frozen (``stop``), or its link down
for 15 s with ``--max-restarts 2`` (``cut``). Prints one JSON line per run:
seconds from the fault to each side's ``mirrorkit: lost peer`` line, and for
``cut`` the seconds from the link's return to the first training step of the
restarted group, and whether every epoch ran once. Default timeouts
(``MIRRORKIT_*`` variables are cleared) unless given with ``--env``.

Usage (from the repository root, as root)::

    python tools/measure_peer_loss.py --faults kill,stop,cut --runs 2
    python tools/measure_peer_loss.py --faults cut --env MIRRORKIT_COLLECTIVE_TIMEOUT=5

Example:
    >>> parse_env(["A=1", "B=x=y"])
    {'A': '1', 'B': 'x=y'}
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
SCRIPT = REPO / "tests" / "fixtures" / "launch_train.py"
FAULTS = ("kill", "stop", "cut")
OUTAGE = 15.0  # seconds the link stays down in the ``cut`` fault


def parse_env(items: list[str]) -> dict[str, str]:
    """``["K=V", ...]`` to a dict."""
    return dict(item.split("=", 1) for item in items)


def _lost_line(log: Path) -> str | None:
    found = [ln for ln in log.read_text().splitlines() if "] mirrorkit: lost peer " in ln]
    return found[0] if found else None


def measure(fault: str, workdir: Path, extra_env: dict[str, str]) -> dict:
    """One run with ``fault``; returns the measured seconds (see the module docstring)."""
    from netns_hosts import TestHosts

    out = workdir / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIRRORKIT_")}
    env.update(extra_env)
    epochs = "12" if fault == "cut" else "400"
    with TestHosts(["hosta", "hostb"]) as hosts:
        logs, procs = {}, {}
        for rank, name in enumerate(["hosta", "hostb"]):
            logs[name] = workdir / f"{name}.log"
            procs[name] = hosts.popen(name, [
                sys.executable, "-m", "mirrorkit", "launch", "-n", "1", "--hosts", "hosta,hostb",
                "--port", "23400", "--node-rank", str(rank),
                "--max-restarts", "2" if fault == "cut" else "0", "--",
                "python", str(SCRIPT), str(out), "--epochs", epochs, "--steps", "40", "--backup"],
                stdout=open(logs[name], "w"), stderr=subprocess.STDOUT, env=env)
        history = out / "history-0.jsonl"
        while not (history.exists() and len(history.read_text().splitlines()) >= 2):
            if procs["hosta"].poll() is not None:
                raise RuntimeError(logs["hosta"].read_text()[-3000:])
            time.sleep(0.1)
        start = time.monotonic()
        if fault == "cut":
            hosts.link("hostb", up=False)
        else:
            for pid in hosts.pids("hostb"):
                if pid != procs["hostb"].pid:   # the worker, not its launcher
                    os.kill(pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        sides = ["hosta", "hostb"] if fault == "cut" else ["hosta"]
        noticed: dict[str, float] = {}
        while len(noticed) < len(sides) and time.monotonic() - start < 120:
            for name in sides:
                if name not in noticed and _lost_line(logs[name]):
                    noticed[name] = round(time.monotonic() - start, 2)
            time.sleep(0.05)
        result = {"fault": fault, "noticed_after": noticed,
                  "lines": {name: _lost_line(logs[name]) for name in sides}}
        if fault == "cut":
            time.sleep(max(0.0, OUTAGE - (time.monotonic() - start)))
            hosts.link("hostb", up=True)
            back = time.time()
            again = None
            while again is None and time.time() - back < 180:
                steps = re.findall(r"FIRST_STEP ([0-9.]+) restart (\d+)", logs["hosta"].read_text())
                again = next((float(t) for t, r in steps if int(r) >= 1), None)
                time.sleep(0.1)
            codes = [procs[name].wait(300) for name in ("hosta", "hostb")]
            done = [json.loads(x)["epoch"] for x in history.read_text().splitlines()]
            result.update(training_again_after_link_up=round(again - back, 2) if again else None,
                          exit_codes=codes, every_epoch_once=sorted(done) == list(range(1, 13)))
        else:
            result["exit_code"] = procs["hosta"].wait(60)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--env", nargs="*", default=[], metavar="K=V")
    args = parser.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        parser.error(f"unknown fault(s) {unknown}; accepted: {', '.join(FAULTS)}")
    for fault in faults:
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="mirrorkit-peer-loss-") as workdir:
                print(json.dumps(measure(fault, Path(workdir), parse_env(args.env))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
