"""A single-machine launch exposes nothing to the network; ``--expose-network`` does as before.

While 2 real TensorFlow workers train under ``mirrorkit launch``, every
process of the job is inspected from the host's network namespace: its
listening TCP sockets (its file descriptors matched against
``/proc/<pid>/net/tcp*``) and the namespace they live in. Isolated, every
listening socket is either on loopback or in a namespace whose only
interface is ``lo``, and the workers' ports refuse connections on this
machine's own address; with ``--expose-network`` the workers listen on
``0.0.0.0`` of the host, as plain TensorFlow's do. Downloads from isolated
workers still work (through the launcher's proxy), and a multi-host launch
says what it exposes. Linux only; the namespace needs root or unprivileged
user namespaces.
"""

from __future__ import annotations

import http.server
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO, clean_env

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="network namespaces are Linux only")

SCRIPT = str(REPO / "tests" / "fixtures" / "launch_train.py")
MIRRORKIT = [sys.executable, "-m", "mirrorkit"]


def _host_address() -> str:
    """This machine's address on its default route (not loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))   # no packet is sent for UDP connect
        return probe.getsockname()[0]


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket process ``pid`` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:   # 0A: LISTEN
                address, port = fields[1].split(":")
                found.append((_address(address), int(port, 16)))
    return found


def interfaces(pid: int) -> set[str]:
    lines = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
    return {line.split(":")[0].strip() for line in lines}


def _job(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / "launch.log"
    proc = subprocess.Popen(
        [*MIRRORKIT, "launch", "-n", "2", *flags, "--", "python", SCRIPT, str(tmp_path / "out"),
         "--epochs", "500"],
        stdout=open(log, "w"), stderr=subprocess.STDOUT, env=clean_env(), start_new_session=True)
    deadline = time.monotonic() + 240
    while log.read_text().count("FIRST_STEP") < 2:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    return proc, log


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _refused(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=3).close()
        return False
    except OSError:
        return True


@pytest.mark.slow
def test_a_training_launch_listens_on_nothing_the_network_can_reach(tmp_path):
    host_net = os.readlink("/proc/self/ns/net")
    proc, log = _job(tmp_path)
    try:
        worker_ports, seen = [], {}
        for pid in _descendants(proc.pid):
            try:
                sockets, net = listening(pid), os.readlink(f"/proc/{pid}/ns/net")
                names = interfaces(pid)
            except OSError:
                continue   # exited meanwhile
            seen[pid] = (net, names, sockets)
            if net == host_net:
                assert all(a in ("127.0.0.1", "::1") for a, _ in sockets), (pid, sockets)
            else:
                assert names == {"lo"}, (pid, names)
                worker_ports += [port for address, port in sockets if address in ("0.0.0.0", "::")]
        # The workers' gRPC servers exist (TensorFlow binds 0.0.0.0), but in the namespace.
        assert len(worker_ports) >= 2, seen
        host = _host_address()
        assert all(_refused(host, port) for port in worker_ports), (host, worker_ports)
    finally:
        _stop(proc)


@pytest.mark.slow
def test_expose_network_restores_tensorflows_own_behaviour(tmp_path):
    host_net = os.readlink("/proc/self/ns/net")
    proc, log = _job(tmp_path, "--expose-network")
    try:
        exposed = [port for pid in _descendants(proc.pid)
                   if os.path.exists(f"/proc/{pid}") and os.readlink(f"/proc/{pid}/ns/net") == host_net
                   for address, port in listening(pid) if address in ("0.0.0.0", "::")]
        assert len(exposed) >= 2, exposed
        assert not _refused(_host_address(), exposed[0])
    finally:
        _stop(proc)


def test_isolated_workers_still_download_over_http(tmp_path):
    (tmp_path / "data.txt").write_text("payload")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(tmp_path), **kwargs)

        def log_message(self, *args):
            pass

    # Served on this machine's own address: out of the workers' namespace.
    server = http.server.ThreadingHTTPServer((_host_address(), 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://{server.server_address[0]}:{server.server_address[1]}/data.txt"
    code = ("import os, urllib.request\n"
            f"print('GOT', urllib.request.urlopen({url!r}, timeout=20).read().decode(), "
            "os.readlink('/proc/self/ns/net'))\n")
    try:
        proc = subprocess.run([*MIRRORKIT, "launch", "-n", "2", "--", "python", "-c", code],
                              capture_output=True, text=True, env=clean_env(), timeout=120)
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = [line for line in proc.stdout.splitlines() if "GOT payload" in line]
    assert len(got) == 2, proc.stdout + proc.stderr
    assert os.readlink("/proc/self/ns/net") not in proc.stdout   # ran isolated


def test_a_multi_host_launch_says_what_it_exposes(tmp_path):
    from conftest import consecutive_free_ports

    port = consecutive_free_ports(2)
    proc = subprocess.run(
        [*MIRRORKIT, "launch", "-n", "1", "--hosts", f"localhost:{port},localhost:{port + 1}",
         "--node-rank", "0", "--", "python", "-c", "print('ok')"],
        capture_output=True, text=True, env=clean_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    warning = [line for line in proc.stderr.splitlines() if "listen on every interface" in line]
    assert warning == [f"[launch] workers listen on every interface of this machine, port(s) "
                       f"{port}, and TensorFlow's traffic is unauthenticated and unencrypted: "
                       "keep the nodes on a private network or VPN and firewall these ports "
                       "(README: Security)"], proc.stderr
    assert "cannot isolate" not in proc.stderr


SYSTEM_PYTHON = Path("/usr/bin/python3")
USERNS_LIMIT = Path("/proc/sys/user/max_user_namespaces")


def _as_nobody(tmp_path: Path, first_on_path: Path | None = None) -> list[str]:
    """The launcher run by an unprivileged user (the repository and click readable to all)."""
    import click

    path = [str(p) for p in (first_on_path, REPO, Path(click.__file__).parent.parent) if p]
    # The test's own interpreter may live in a folder only root can enter.
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env",
            f"PYTHONPATH={os.pathsep.join(path)}",
            f"HOME={tmp_path}", str(SYSTEM_PYTHON), "-m", "mirrorkit", "launch", "-n", "2",
            "--", str(SYSTEM_PYTHON), "-c",
            "import os; print('NET', os.readlink('/proc/self/ns/net'), os.getuid())"]


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not SYSTEM_PYTHON.exists() or not shutil.which("setpriv"),
    reason="runs the launcher as another user (root, setpriv and /usr/bin/python3 needed)")


@needs_root
def test_an_unprivileged_user_gets_isolation_through_a_user_namespace(tmp_path):
    if USERNS_LIMIT.exists() and int(USERNS_LIMIT.read_text()) == 0:
        pytest.skip("user namespaces are disabled on this machine")
    tmp_path.chmod(0o777)
    proc = subprocess.run(_as_nobody(tmp_path), capture_output=True, text=True, timeout=60,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    nets = {line.split()[2] for line in proc.stdout.splitlines() if " NET " in line}
    uids = {line.split()[3] for line in proc.stdout.splitlines() if " NET " in line}
    assert len(nets) == 1 and nets != {os.readlink("/proc/self/ns/net")}, proc.stdout
    assert uids == {"65534"}, proc.stdout   # files stay the user's own
    assert "cannot isolate" not in proc.stderr, proc.stderr


@needs_root
def test_where_a_namespace_cannot_be_made_the_launcher_says_so_in_one_line(tmp_path):
    # A site hook that starts a thread: the kernel refuses a user namespace to
    # a multi-threaded process (EINVAL), as it would for such a real hook.
    # The thread waits for ever (a daemon: it does not hold up the exit), not
    # 30 s, which a loaded machine's launcher could take to reach its unshare.
    # pytest's tmp_path sits in a folder only root may enter: use one nobody can read.
    site = Path(tempfile.mkdtemp(prefix="mirrorkit-site-"))
    site.chmod(0o755)
    (site / "sitecustomize.py").write_text(
        "import threading\n"
        "threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
        "print('a site hook that prints')\n")
    tmp_path.chmod(0o777)
    try:
        proc = subprocess.run(_as_nobody(tmp_path, site), capture_output=True, text=True,
                              timeout=60, cwd=str(tmp_path))
    finally:
        shutil.rmtree(site)
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "cannot isolate" in line]
    assert said == ["[launch] cannot isolate the workers' network here (unshare(CLONE_NEWUSER|"
                    "CLONE_NEWNET): Invalid argument): their TensorFlow servers listen on every "
                    "interface, as plain TensorFlow's do"], proc.stderr
    nets = {line.split()[2] for line in proc.stdout.splitlines() if " NET " in line}
    assert nets == {os.readlink("/proc/self/ns/net")}, proc.stdout   # ran, not isolated
