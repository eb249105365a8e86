"""Run mirrorkit's compat, equivalence and multi-worker tests against several TensorFlow/Keras pairs.

Each pair gets its own virtual environment (``.matrix/tf<X>-keras<Y>``,
git-ignored and reused on the next run), with mirrorkit installed from this
checkout and exactly that TensorFlow and Keras; then the selected tests run
there, and one result per pair (versions as installed, passed / failed /
skipped, seconds, the failures' names) is written to ``--output`` as JSON
and as a Markdown table.

Usage (from the repository root)::

    python tools/compat_matrix.py                                 # the tested pairs below
    python tools/compat_matrix.py --pairs 2.20.0:3.15.1 --tests tests/compat
    python tools/compat_matrix.py --install-only                  # prepare the venvs
    python tools/compat_matrix.py --pairs nightly                 # constraints/nightly.txt

``nightly`` is the pair pinned in ``constraints/nightly.txt`` (``tf-nightly``
and ``keras-nightly``, whose distributions are not named ``tensorflow`` and
``keras``): mirrorkit goes in with ``--no-deps`` over them, then its other
requirements and the test extra's (without Ray), read from ``pyproject.toml``.
``.ci/run`` runs this pair after the suite.

Example:
    >>> parse_pairs("2.21.0:3.15.1,2.19.1")
    [('2.21.0', '3.15.1'), ('2.19.1', None)]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The newest TensorFlow and the two minors before it that PyPI serves for
# Python 3.11, each with the Keras 3 that `pip install tensorflow==X` picks
# (None: let pip choose).
DEFAULT_PAIRS = "2.21.0:3.15.1,2.20.0,2.19.1"
DEFAULT_TESTS = ("tests/compat", "tests/distribute/test_equivalence.py")
NIGHTLY = "nightly"
NIGHTLY_CONSTRAINTS = ROOT / "constraints" / "nightly.txt"
# Provided by the nightlies themselves, or not wanted in their venv (Ray: its own tests).
_NOT_FOR_NIGHTLY = ("tensorflow", "keras", "ray")


def parse_pairs(text: str) -> list[tuple[str, str | None]]:
    """``"TF[:KERAS],..."`` -> ``[(tf, keras or None), ...]``.

    Example:
        >>> parse_pairs("2.20.0")
        [('2.20.0', None)]
    """
    pairs = []
    for item in text.split(","):
        tf_version, _, keras_version = item.strip().partition(":")
        if not tf_version:
            raise SystemExit(f"--pairs: expected TF[:KERAS] items. Received: {text!r}")
        pairs.append((tf_version, keras_version or None))
    return pairs


def _venv(tf_version: str, keras_version: str | None) -> Path:
    # MIRRORKIT_MATRIX_DIR lets another checkout reuse prepared venvs.
    base = Path(os.environ.get("MIRRORKIT_MATRIX_DIR", ROOT / ".matrix"))
    if tf_version == NIGHTLY:
        # New pins, new venv: the folder is named after the pinned versions.
        return base / ("nightly-" + "-".join(_nightly_pins()).replace("==", ""))
    return base / f"tf{tf_version}-keras{keras_version or 'auto'}"


def _nightly_pins() -> list[str]:
    return [line.split("#")[0].strip() for line in NIGHTLY_CONSTRAINTS.read_text().splitlines()
            if line.split("#")[0].strip()]


def _requirements_besides_tensorflow() -> list[str]:
    """mirrorkit's requirements and its test extra's, without TensorFlow, Keras and Ray."""
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["test"]
    return [req for req in wanted
            if re.split(r"[\[<>=!~ ;]", req, maxsplit=1)[0].lower() not in _NOT_FOR_NIGHTLY]


def _install_nightly(python: Path) -> None:
    steps = [[str(python), "-m", "pip", "install", "-q", "uv"],
             [str(python.parent / "uv"), "pip", "install", "-q", "-p", str(python),
              "-r", str(NIGHTLY_CONSTRAINTS), *_requirements_besides_tensorflow()],
             [str(python.parent / "uv"), "pip", "install", "-q", "-p", str(python),
              "--no-deps", "-e", str(ROOT)]]
    for cmd in steps:
        proc = _run(cmd)
        if proc.returncode != 0:
            raise RuntimeError(f"could not install the nightly pair ({' '.join(cmd[:4])} ...):\n"
                               f"{proc.stderr[-3000:]}")


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, text=True, capture_output=True, **kwargs)


def install(tf_version: str, keras_version: str | None) -> Path:
    """Create (or reuse) the pair's venv; return its python.

    Example:
        >>> install("2.20.0", None)            # doctest: +SKIP
        PosixPath('.../.matrix/tf2.20.0-kerasauto/bin/python')
    """
    venv = _venv(tf_version, keras_version)
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    if stamp.exists():
        return python
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    if tf_version == NIGHTLY:
        _install_nightly(python)
        stamp.write_text(datetime.datetime.now().isoformat())
        return python
    pins = [f"tensorflow=={tf_version}"] + ([f"keras=={keras_version}"] if keras_version else [])
    proc = _run([str(python), "-m", "pip", "install", "-q", *pins, "-e", f"{ROOT}[test]"])
    if proc.returncode != 0:
        raise RuntimeError(f"pip could not install {pins} with mirrorkit:\n{proc.stderr[-3000:]}")
    stamp.write_text(datetime.datetime.now().isoformat())
    return python


def _installed(python: Path) -> dict[str, str]:
    # Whichever distribution provides each module (tf-nightly provides tensorflow).
    code = ("import json; from mirrorkit.patching.versions import installed_version as v; "
            "print(json.dumps({p: v(p) for p in "
            "('tensorflow', 'keras', 'tensorflow-datasets', 'numpy')}))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return json.loads(_run([str(python), "-c", code], check=True, env=env).stdout)


def run_tests(python: Path, tests: list[str], workdir: Path) -> dict:
    """Run ``tests`` with the venv's python; return counts, failures and seconds.

    Example:
        >>> run_tests(Path(".matrix/x/bin/python"), ["tests/compat"], Path("/tmp"))  # doctest: +SKIP
    """
    report = workdir / "junit.xml"
    start = time.monotonic()
    # This checkout's code, also in the subprocesses tests start (not
    # whatever checkout the venv's editable install points at).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = _run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                 f"--junitxml={report}", *tests], cwd=str(ROOT), env=env)
    seconds = round(time.monotonic() - start, 1)
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures = []
    if report.exists():
        for case in ElementTree.parse(report).getroot().iter("testcase"):
            outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), None)
            key = {"failure": "failed", "error": "errors", "skipped": "skipped"}.get(outcome,
                                                                                    "passed")
            counts[key] += 1
            if outcome in ("failure", "error"):
                failures.append(f"{case.get('classname')}::{case.get('name')}")
    tail = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
    if proc.returncode != 0:
        # What a CI log needs to see why: pytest's own report of the failures.
        print("\n".join(proc.stdout.strip().splitlines()[-150:]), proc.stderr[-2000:], sep="\n")
    return {**counts, "exit_code": proc.returncode, "seconds": seconds,
            "failures": failures, "summary": tail[0] if tail else ""}


def _markdown(rows: list[dict]) -> str:
    lines = ["| TensorFlow | Keras | passed | failed | skipped | seconds | result |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        v = r["versions"]
        ok = "pass" if r["exit_code"] == 0 else "FAIL: " + ", ".join(r["failures"][:4])
        lines.append(f"| {v.get('tensorflow')} | {v.get('keras')} | {r['passed']} | "
                     f"{r['failed'] + r['errors']} | {r['skipped']} | {r['seconds']:.0f} | {ok} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", default=DEFAULT_PAIRS, help="TF[:KERAS],... (default: %(default)s)")
    parser.add_argument("--tests", nargs="*", default=list(DEFAULT_TESTS))
    parser.add_argument("--output", default="tools/compat-matrix",
                        help="folder for results.json and results.md (default: %(default)s)")
    parser.add_argument("--install-only", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    out = ROOT / args.output
    out.mkdir(parents=True, exist_ok=True)
    for tf_version, keras_version in parse_pairs(args.pairs):
        started = time.monotonic()
        python = install(tf_version, keras_version)
        print(f"   installed in {time.monotonic() - started:.0f} s", flush=True)
        versions = _installed(python)
        print(f"== tensorflow {versions['tensorflow']} + keras {versions['keras']}", flush=True)
        if args.install_only:
            continue
        result = run_tests(python, args.tests, python.parent.parent)
        print(f"   {result['summary']} ({result['seconds']:.0f} s)", flush=True)
        rows.append({"requested": {"tensorflow": tf_version, "keras": keras_version},
                     "versions": versions, **result})
    if rows:
        # Rows of other pairs from an earlier run stay (one run per pair is fine).
        previous = out / "results.json"
        if previous.exists():
            ran = {(r["versions"]["tensorflow"], r["versions"]["keras"]) for r in rows}
            rows = [r for r in json.loads(previous.read_text()).get("rows", [])
                    if (r["versions"]["tensorflow"], r["versions"]["keras"]) not in ran] + rows
        rows.sort(key=lambda r: r["versions"]["tensorflow"], reverse=True)
        meta = {"date": datetime.date.today().isoformat(), "python": platform.python_version(),
                "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
                "tests": args.tests}
        (out / "results.json").write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")
        (out / "results.md").write_text(
            f"Compat matrix, {meta['date']}, Python {meta['python']}, {meta['machine']}; tests: "
            f"{' '.join(args.tests)}\n\n" + _markdown(rows))
        print((out / "results.md").read_text())
    return 0 if all(r["exit_code"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
