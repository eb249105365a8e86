"""Write tests/durations.json from a pytest run's ``--durations=0`` report or CPU log.

The parallel test run (tests/conftest.py) starts the longest work first; these
measured seconds are its weights: setup + call + teardown from a serial run's
report, or better, each test's CPU seconds with its subprocesses from a
``MIRRORKIT_TEST_CPU_LOG`` run (``--cpu``), which the other tests running
beside it do not inflate. Tests missing from the file get a guess from their
markers, so the file only needs refreshing when the slow tests change a lot.

Example:
    MIRRORKIT_TEST_CPU_LOG=/tmp/cpu.jsonl .venv/bin/python -m pytest
    python tools/test_durations.py --cpu /tmp/cpu.jsonl
    PYTEST_ADDOPTS="-n 0 --durations=0" .venv/bin/python -m pytest > /tmp/serial.log
    python tools/test_durations.py /tmp/serial.log
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^(\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(\S.*)$")
OUT = Path(__file__).resolve().parent.parent / "tests" / "durations.json"


def main(argv: list[str] | None = None) -> None:
    """Read the report, keep tests of a second or more, write the JSON file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="pytest output with --durations=0")
    parser.add_argument("--cpu", action="store_true",
                        help="REPORT is a MIRRORKIT_TEST_CPU_LOG file (JSON lines)")
    args = parser.parse_args(argv)
    seconds: dict[str, float] = defaultdict(float)
    for line in args.report.read_text().splitlines():
        if args.cpu and line.strip():
            record = json.loads(line)
            seconds[record["test"]] += float(record["cpu"])
            continue
        match = LINE.match(line.strip())
        if match:
            seconds[match.group(2).strip()] += float(match.group(1))
    kept = {k: round(v, 1) for k, v in sorted(seconds.items()) if v >= 1.0}
    OUT.write_text(json.dumps(kept, indent=0, sort_keys=True) + "\n")
    print(f"{len(kept)} tests of 1 s or more written to {OUT}")


if __name__ == "__main__":
    main()
