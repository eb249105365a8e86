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
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


#: Stand-ins that make ``import pandas`` / ``import matplotlib`` fail (see clean_env).
BASE_INSTALL = REPO / "tests" / "fixtures" / "base_install"


COLLECTIVE_TIMEOUT_VAR = "MIRRORKIT_COLLECTIVE_TIMEOUT"


def clean_env(*, optional_packages: bool = False, **extra: str | None) -> dict[str, str]:
    """The test process's environment minus anything that steers mirrorkit.

    The processes it starts see the packages of a base ``pip install
    mirrorkit``: the test extra's pandas (which Ray brings) and matplotlib
    (for the PNGs) are hidden unless ``optional_packages``. Keras imports both
    at start-up whenever they are installed, which costs every TensorFlow
    process about 0.7 CPU-s, and the suite starts several hundred. A test
    that needs them (Ray, a PNG written by a subprocess) asks for them. The
    same folder's ``sitecustomize`` gives a plain-Python process (one that
    has not imported mirrorkit when it imports TensorFlow) the collector
    policy mirrorkit's processes have: about 1.2 CPU-s less per reference
    run, nothing it computes changed. An ``extra`` of None removes that
    variable.
    """
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MIRRORKIT_", "SLURM_")) and k != "TF_CONFIG"}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Workers a test starts tolerate 30 s without a peer's heartbeat, not the
    # product's 10 s: four xdist workers on two loaded cores once starved a
    # launched worker that long and aborted a job whose test has nothing to do
    # with lost peers. Tests of peer loss set their own (shorter) timeout.
    env[COLLECTIVE_TIMEOUT_VAR] = "30"
    env.update(extra)
    for name in [name for name, value in env.items() if value is None]:
        del env[name]
    if not optional_packages:
        # Last on PYTHONPATH (still before site-packages): a test's own
        # sitecustomize (or the launcher's bootstrap) comes first.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"),
                                                          str(BASE_INSTALL)]))
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


# -- Test tiers and parallel runs (pytest-xdist) ----------------------------------
#
# `python -m pytest` runs the whole suite on several xdist workers (`-n auto
# --dist loadgroup` in pyproject.toml); `python -m pytest -m fast` is the
# in-process tier for development (tests/test_tiers.py keeps every package in it).
# Under xdist:
#   - `@pytest.mark.exclusive` tests (timing or CPU-share assertions) run with
#     no other test of the session running: they hold a session-wide file lock
#     exclusively, every other test holds it shared. They also share one
#     xdist group, so they run one after another on one worker.
#   - `@pytest.mark.xdist_group(name)` keeps singletons (the Slurm cluster,
#     fixed ports) on one worker; tests that use a module-scoped fixture of
#     their module are grouped per module, so the fixture's work runs once.
#   - each worker gets a private TMPDIR, so what one test finds in the temporary
#     folder (mirrorkit's private scratch folders, lock files) is its own.

import contextlib  # noqa: E402
import fcntl  # noqa: E402
import gc  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

_LOCK_DIR = pytest.StashKey[Path]()
_WORKER_TMP = pytest.StashKey[Path]()
_LOCK = pytest.StashKey["_SessionLock"]()


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per core plus one, ~3 GiB each.

    The extra worker keeps the cores busy while a test waits (a join timeout,
    a killed peer, a launcher's restart). More cost more than they fill: the
    suite's TensorFlow processes each need more CPU the more of them share a
    core (caches, switches). Measured on 2 cores, the whole CI run: 4 workers
    2289-2433 CPU-s of tests and 1155-1435 s; 3 workers 1960 CPU-s and 1111 s.
    Fewer are slower too: with 2 the same tests took 12.5 % fewer CPU-s (1934
    against 2211 for the first 232) but the cores stood 10-40 % idle whenever
    a worker waited (Slurm, Ray, a join timeout), and the run fell behind.
    """
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        memory_gib = 3.0 * 2 * (cores or 1)
    return max(1, min((cores or 1) + 1, int(memory_gib // 3)))


class _SessionLock:
    """Shared for ordinary tests, exclusive for ``exclusive`` ones, across xdist workers.

    A waiting exclusive test holds the gate, so no new shared holder starts
    while it waits for the running ones to finish (it cannot be starved).
    """

    def __init__(self, folder: Path) -> None:
        self._gate = open(folder / "gate.lock", "a+")
        self._main = open(folder / "main.lock", "a+")

    held_exclusively = False

    def acquire_exclusive(self) -> None:
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        fcntl.flock(self._main, fcntl.LOCK_EX)
        self.held_exclusively = True

    def release_exclusive(self) -> None:
        self.held_exclusively = False
        fcntl.flock(self._main, fcntl.LOCK_UN)
        fcntl.flock(self._gate, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def hold(self, exclusive: bool):
        if exclusive:
            fcntl.flock(self._gate, fcntl.LOCK_EX)
            fcntl.flock(self._main, fcntl.LOCK_EX)
        else:
            fcntl.flock(self._gate, fcntl.LOCK_SH)
            fcntl.flock(self._main, fcntl.LOCK_SH)
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self._main, fcntl.LOCK_UN)
            if exclusive:
                fcntl.flock(self._gate, fcntl.LOCK_UN)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    worker_input = getattr(config, "workerinput", None)
    if worker_input is None:
        if getattr(config.option, "numprocesses", None):   # the xdist controller
            config.stash[_LOCK_DIR] = Path(tempfile.mkdtemp(prefix="mk-pytest-"))
        return
    if "mirrorkit_lock_dir" not in worker_input:
        return
    config.stash[_LOCK] = _SessionLock(Path(worker_input["mirrorkit_lock_dir"]))
    # A private temporary folder per worker, for this process and every one it starts.
    private = Path(tempfile.mkdtemp(prefix=f"mk-{worker_input['workerid']}-"))
    private.chmod(0o1777)   # like /tmp: tests that run a program as another user
    config.stash[_WORKER_TMP] = private
    os.environ["TMPDIR"] = str(private)
    tempfile.tempdir = None   # computed again from TMPDIR


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    folder = node.config.stash.get(_LOCK_DIR, None)
    if folder is not None:
        node.workerinput["mirrorkit_lock_dir"] = str(folder)


def pytest_unconfigure(config: pytest.Config) -> None:
    for key in (_WORKER_TMP, _LOCK_DIR):
        folder = config.stash.get(key, None)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _module_fixture_users(item: pytest.Item) -> bool:
    """Does ``item`` use a (non-autouse) module-scoped fixture defined in its own module?"""
    info, module = getattr(item, "_fixtureinfo", None), item.getparent(pytest.Module)
    if info is None or module is None:
        return False
    for name in info.names_closure:
        for fixturedef in info.name2fixturedefs.get(name, ()):
            if (fixturedef.scope == "module" and not getattr(fixturedef, "_autouse", False)
                    and fixturedef.baseid == module.nodeid):
                return True
    return False


# The fast tier: these files whole (in-process, seconds), plus the tests marked
# `@pytest.mark.fast` one by one in the other files.
FAST_FILES = {
    "tests/commands/test_tf_config_cli.py",
    "tests/data/test_datasets.py",
    "tests/distribute/test_cluster.py",
    "tests/distribute/test_k8s_manifest.py",
    "tests/patching/test_engine.py",
    "tests/patching/test_outside_engine.py",
    "tests/test_readme.py",
    "tests/test_tiers.py",
    "tests/training/test_callbacks.py",
    "tests/training/test_models.py",
    "tests/training/test_targets.py",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.relative_to(REPO).as_posix() in FAST_FILES:
            item.add_marker(pytest.mark.fast)
        if item.get_closest_marker("xdist_group") is not None:
            continue
        if item.get_closest_marker("exclusive") is not None:
            item.add_marker(pytest.mark.xdist_group("exclusive"))
        elif _module_fixture_users(item):
            item.add_marker(pytest.mark.xdist_group(item.getparent(pytest.Module).nodeid))


@pytest.hookimpl(tryfirst=True)   # before xdist tells the controller it has collected
def pytest_collection_finish(session: pytest.Session) -> None:
    """On an xdist worker: write each test's group for the controller's scheduler."""
    # Collection imported TensorFlow and Keras, whose ~300,000 objects live as
    # long as the worker: out of the collector's way, as mirrorkit's own
    # processes do (mirrorkit.launcher.import_gc).
    gc.freeze()
    worker_input = getattr(session.config, "workerinput", None)
    if worker_input is None or "mirrorkit_lock_dir" not in worker_input:
        return
    groups, weights, exclusive = {}, {}, []
    durations = REPO / "tests" / "durations.json"
    measured = json.loads(durations.read_text()) if durations.is_file() else {}
    for item in session.items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if names:
            groups[item.nodeid] = "_".join(names)
        if item.get_closest_marker("exclusive") is not None:
            exclusive.append(item.nodeid)
        # Its cost, so the longest work starts first: measured seconds
        # (tests/durations.json, tools/test_durations.py), else a guess from
        # its markers: a slow run ~20 s, a fast test well under a second, the
        # rest (mostly one fresh interpreter) ~4 s.
        weights[item.nodeid] = measured.get(item.nodeid) or (
            20 if item.get_closest_marker("slow") else
            0.1 if item.get_closest_marker("fast") else 4)
    folder = Path(worker_input["mirrorkit_lock_dir"])
    part = folder / f"groups-{worker_input['workerid']}.json.part"
    part.write_text(json.dumps({"groups": groups, "weights": weights, "exclusive": exclusive}))
    part.rename(folder / f"groups-{worker_input['workerid']}.json")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadgroup`` that works on pytest 9 too.

    xdist marks a grouped test by appending ``@group`` to its node id, which
    pytest 9 no longer lets a plugin change; here the workers write the groups
    to a file (above) and the scheduler reads them.
    """
    folder = config.stash.get(_LOCK_DIR, None)
    if config.getvalue("dist") != "loadgroup" or folder is None:
        return None
    from xdist.scheduler import LoadGroupScheduling

    class FileGroupScheduling(LoadGroupScheduling):
        _found: dict | None = None
        _ordered = False

        def _collected(self) -> dict:
            if self._found is None:   # every worker has collected by now (schedule() runs after)
                files = sorted(folder.glob("groups-*.json"))
                self._found = json.loads(files[0].read_text()) if files else {}
            return self._found

        def _split_scope(self, nodeid: str) -> str:
            group = self._collected().get("groups", {}).get(nodeid)
            return group if group is not None else super()._split_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            if not self._ordered:
                # The heaviest work units first; units of exclusive tests only
                # last: started early, each would wait for the longest running
                # tests to drain the pool, at the end only for the short ones.
                weights = self._collected().get("weights", {})
                exclusive = set(self._collected().get("exclusive", []))
                units = sorted(self.workqueue.items(), key=lambda unit: (
                    all(n in exclusive for n in unit[1]),
                    -sum(weights.get(n, 4) for n in unit[1])))
                self.workqueue.clear()
                self.workqueue.update(units)
                self._ordered = True
            super()._assign_work_unit(node)

    return FileGroupScheduling(config, log)


def _exclusive(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("exclusive") is not None


def _cpu_seconds() -> float:
    import resource
    return sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


@contextlib.contextmanager
def _cpu_log(item: pytest.Item):
    """With MIRRORKIT_TEST_CPU_LOG=FILE: each test's CPU seconds, its processes included.

    Wall time on 2 shared cores says little about what a test costs the suite;
    CPU seconds (this process and every child it waited for: TensorFlow
    subprocesses, launched workers) do, whatever runs beside it. One JSON line
    per test (with its end time and xdist worker, to draw the session's
    timeline); ``tools/test_durations.py --cpu FILE`` turns them into weights.
    """
    log = os.environ.get("MIRRORKIT_TEST_CPU_LOG")
    if not log:
        yield
        return
    start, wall = _cpu_seconds(), time.monotonic()
    try:
        yield
    finally:
        line = json.dumps({"test": item.nodeid, "cpu": round(_cpu_seconds() - start, 2),
                           "wall": round(time.monotonic() - wall, 2),
                           "end": round(time.time(), 1), "worker": os.environ.get(
                               "PYTEST_XDIST_WORKER", "")})
        with open(log, "a") as out:
            out.write(line + "\n")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    with _cpu_log(item):
        return (yield from _held(item, nextitem))


def _held(item: pytest.Item, nextitem):
    lock = item.config.stash.get(_LOCK, None)
    if lock is None:
        return (yield)
    if not _exclusive(item):
        with lock.hold(exclusive=False):
            return (yield)
    # Consecutive exclusive tests on this worker (a module's group) keep the
    # lock between them: released in between, the other workers would start
    # new tests and the next exclusive one would wait for all of them again.
    if not lock.held_exclusively:
        lock.acquire_exclusive()
    try:
        return (yield)
    finally:
        if not _exclusive(nextitem):
            lock.release_exclusive()


def compare_jobs(script: Path, **controls: dict[str, str]) -> dict[str, tuple[list[str], dict]]:
    """The runs that compare an unmodified ``script`` with plain Python, by name.

    ``plain`` (``python script.py``), ``run`` (``mirrorkit run`` on 2 simulated
    CPUs), ``launch`` (2 workers, each under ``mirrorkit run``), and one
    ``run`` per ``controls`` entry with those environment variables (a fix
    turned off by name). Each is ``(command, environment)`` for :func:`run_jobs`.

    Example:
        jobs = compare_jobs(SCRIPT, off={"MIRRORKIT_COMPAT_DISABLE": "sparse-gradient-sums"})
    """
    run = [sys.executable, "-m", "mirrorkit", "run", "--simulate-cpus", "2", str(script)]
    jobs = {"plain": ([sys.executable, str(script)], {}), "run": (run, {}),
            "launch": ([sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--",
                        "mirrorkit", "run", str(script)], {})}
    jobs.update({name: (run, env) for name, env in controls.items()})
    return jobs


def run_jobs(jobs: dict[str, tuple[list[str], dict]], folder: Path, *,
             tag: str = "RESULT ") -> dict[str, list[dict]]:
    """Run ``jobs`` two at a time, each in its own subfolder; each one's ``tag`` JSON lines.

    A job that exits non-zero or prints no such line fails the test with its output.

    Example:
        found = run_jobs(compare_jobs(SCRIPT), tmp_path)   # found["launch"]: one per worker
    """
    from concurrent.futures import ThreadPoolExecutor

    def one(name: str) -> list[dict]:
        command, env = jobs[name]
        cwd = folder / name
        cwd.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(command, cwd=str(cwd), env=clean_env(**env), capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        found = [json.loads(line.split(tag, 1)[1]) for line in proc.stdout.splitlines()
                 if tag in line]
        assert found, proc.stdout[-2000:]
        return found

    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(one, name) for name in jobs}
        return {name: future.result() for name, future in futures.items()}
