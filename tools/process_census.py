"""Count the Python processes a command starts, and what each cost: where a test run's CPU goes.

The suite is CPU-bound on 2 cores and most of its CPU is spent in fresh
interpreters (TensorFlow's import alone is seconds), so the question "what
would make it faster" is answered per process. ``on`` puts a ``.pth`` hook
into the current environment's site-packages; while ``PROCESS_CENSUS_DIR``
names a folder (not a ``MIRRORKIT_`` variable: the tests' ``clean_env`` drops
those), every interpreter started from that environment writes one JSON file
there when it exits normally: argv, CPU seconds, wall seconds, whether it
imported TensorFlow, and the pytest test that started it (a process killed by
a signal writes nothing). ``report DIR`` sums them per test file and per
command line; ``off`` removes the hook.

Example:
    python tools/process_census.py on
    PROCESS_CENSUS_DIR=/tmp/census python -m pytest
    python tools/process_census.py report /tmp/census
    python tools/process_census.py off
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sysconfig
from pathlib import Path

HOOK = "_mirrorkit_census"
_MODULE = '''"""Written by mirrorkit's tools/process_census.py; remove with its `off`."""
import os

if os.environ.get("PROCESS_CENSUS_DIR"):
    import atexit
    import json
    import resource
    import sys
    import time

    _START = time.time()

    def _write():
        usage = resource.getrusage(resource.RUSAGE_SELF)
        record = {"argv": sys.argv[:6], "cpu": usage.ru_utime + usage.ru_stime,
                  "wall": time.time() - _START, "tensorflow": "tensorflow" in sys.modules,
                  "test": os.environ.get("PYTEST_CURRENT_TEST")}
        folder = os.environ["PROCESS_CENSUS_DIR"]
        try:
            with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as out:
                json.dump(record, out)
        except OSError:
            pass

    atexit.register(_write)
'''


def _site() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _on() -> None:
    (_site() / f"{HOOK}.py").write_text(_MODULE)
    (_site() / f"{HOOK}.pth").write_text(f"import {HOOK}\n")
    print(f"hook in {_site()}; set PROCESS_CENSUS_DIR=DIR (an existing folder) to record")


def _off() -> None:
    for suffix in (".py", ".pth"):
        (_site() / f"{HOOK}{suffix}").unlink(missing_ok=True)
    print(f"hook removed from {_site()}")


def _report(folder: Path, top: int) -> None:
    records = [json.loads(p.read_text()) for p in folder.glob("*.json")]
    tf = [r for r in records if r["tensorflow"]]
    print(f"{len(records)} processes, {sum(r['cpu'] for r in records):.0f} CPU-s; "
          f"{len(tf)} imported TensorFlow, {sum(r['cpu'] for r in tf):.0f} CPU-s")
    by_file: dict[str, list] = collections.defaultdict(list)
    by_command: dict[str, list] = collections.defaultdict(list)
    for record in records:
        by_file[(record["test"] or "(no test)").split("::")[0]].append(record)
        # Temporary paths differ run to run: one command line is one row.
        command = re.sub(r"/tmp/\S+", "TMP", " ".join(record["argv"]))
        by_command[command].append(record)
    for title, groups in (("per test file", by_file), ("per command line", by_command)):
        print(f"\n{title}: CPU-s, processes")
        ranked = sorted(groups.items(), key=lambda item: -sum(r["cpu"] for r in item[1]))
        for name, group in ranked[:top]:
            print(f"{sum(r['cpu'] for r in group):8.1f} {len(group):4d}  {name[:110]}")


def main(argv: list[str] | None = None) -> None:
    """``on``, ``off`` or ``report DIR`` (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["on", "off", "report"])
    parser.add_argument("folder", nargs="?", type=Path,
                        help="report: the folder PROCESS_CENSUS_DIR named")
    parser.add_argument("--top", type=int, default=25, help="rows per table (default 25)")
    args = parser.parse_args(argv)
    if args.action == "on":
        _on()
    elif args.action == "off":
        _off()
    elif args.folder is None or not args.folder.is_dir():
        parser.error("report needs the folder PROCESS_CENSUS_DIR named. "
                     f"Received: {args.folder}")
    else:
        _report(args.folder, args.top)


if __name__ == "__main__":
    main()
