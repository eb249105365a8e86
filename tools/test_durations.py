"""Write tests/durations.json from pytest runs' CPU logs or a ``--durations=0`` report.

The parallel test run (tests/conftest.py) starts the longest work first, so
that no long test starts near the end and runs alone while the other
workers idle (measured on 2 cores: the last minutes of a run at 13-44 % CPU
when tests were ordered by their CPU seconds, because a test that mostly
waits, on a killed worker's detection or a lock, costs little CPU but holds
a worker as long as any). These weights are how long each test holds a
worker in the parallel run: its wall seconds in ``MIRRORKIT_TEST_CPU_LOG``
files (``--cpu``; the median over several runs, as two runs of one commit
differ by up to 40 % on this shared machine), or setup + call + teardown
from a serial run's report. Tests missing from the file get a guess from
their markers, so the file only needs refreshing when the slow tests change
a lot.

Example:
    MIRRORKIT_TEST_CPU_LOG=/tmp/cpu1.jsonl .venv/bin/python -m pytest
    python tools/test_durations.py --cpu /tmp/cpu1.jsonl /tmp/cpu2.jsonl
    PYTEST_ADDOPTS="-n 0 --durations=0" .venv/bin/python -m pytest > /tmp/serial.log
    python tools/test_durations.py /tmp/serial.log
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^(\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(\S.*)$")
OUT = Path(__file__).resolve().parent.parent / "tests" / "durations.json"


def main(argv: list[str] | None = None) -> None:
    """Read the reports, keep tests of a second or more, write the JSON file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", type=Path, nargs="+",
                        help="pytest output with --durations=0, or CPU logs with --cpu")
    parser.add_argument("--cpu", action="store_true",
                        help="REPORTS are MIRRORKIT_TEST_CPU_LOG files (JSON lines)")
    args = parser.parse_args(argv)
    runs: list[dict[str, float]] = []
    for report in args.reports:
        seconds: dict[str, float] = defaultdict(float)
        for line in report.read_text().splitlines():
            if args.cpu and line.strip():
                record = json.loads(line)
                seconds[record["test"]] += float(record["wall"])
                continue
            match = LINE.match(line.strip())
            if match:
                seconds[match.group(2).strip()] += float(match.group(1))
        runs.append(seconds)
    tests = sorted(set().union(*runs))
    median = {t: statistics.median(run[t] for run in runs if t in run) for t in tests}
    kept = {k: round(v, 1) for k, v in median.items() if v >= 1.0}
    OUT.write_text(json.dumps(kept, indent=0, sort_keys=True) + "\n")
    print(f"{len(kept)} tests of 1 s or more written to {OUT}")

if __name__ == "__main__":
    main()
