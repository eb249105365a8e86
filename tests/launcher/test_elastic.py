"""Elastic ``mirrorkit launch --min-workers``: lost workers, renumbered survivors, agreement.

Three tiers: the pure lost-worker rule (:mod:`mirrorkit.launcher.membership`)
on constructed failures; the rendezvous protocol with three in-process
clients on loopback (one of them vanishing like a dead host); and real
launchers running ``fixtures/elastic_train.py``, a 3-worker
MultiWorkerMirroredStrategy Keras run resumed by mirrorkit's
``BackupAndRestore``. There a worker is lost for good for real: it SIGKILLs
itself mid-training, and every later start of the same original worker
(``MIRRORKIT_ORIGINAL_RANK``, set by the launcher) exits at once, as a worker
on a machine that is gone never comes back.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO, clean_env, consecutive_free_ports

from mirrorkit.launcher.membership import Blame, LocalAgreement, Membership, View
from mirrorkit.launcher.rendezvous import RendezvousClient
from mirrorkit.launcher.spec import LaunchSpec

SCRIPT = str(REPO / "tests" / "fixtures" / "elastic_train.py")
MAIN = [sys.executable, "-c", "from mirrorkit.cli import main; main()"]
EPOCHS = 4


def blame(original: int, rank: int | None = None, cause: str = "killed by SIGKILL") -> Blame:
    return Blame(original, original if rank is None else rank, f"localhost:{23410 + original}",
                 cause)


# --- the rule, pure -----------------------------------------------------------

@pytest.mark.fast
def test_a_worker_failing_first_twice_in_a_row_is_lost_and_ranks_renumber():
    m = Membership(world=3, min_workers=2)
    first = m.decide(m.first_view(), blame(2))
    assert first.view == View(1, (0, 1, 2), "attempt 1 failed: worker 2 (localhost:23412) "
                                            "killed by SIGKILL") and first.line is None
    second = m.decide(first.view, blame(2))
    assert second.view.members == (0, 1) and second.view.attempt == 2
    assert second.line == ("mirrorkit: worker 2 (localhost:23412) lost: killed by SIGKILL "
                           "twice; continuing with 2 of 3 workers (min 2)")
    assert second.view.reason == second.line


@pytest.mark.fast
def test_different_workers_failing_in_turn_lose_nobody():
    m = Membership(world=3, min_workers=2)
    view = m.first_view()
    for original in (2, 1, 2, 1):
        view = m.decide(view, blame(original)).view
    assert view.members == (0, 1, 2) and not m.lost


@pytest.mark.fast
def test_losing_the_chief_makes_the_next_worker_chief_and_names_both_ranks():
    m = Membership(world=3, min_workers=2)
    view = m.decide(m.first_view(), blame(0)).view
    decision = m.decide(view, blame(0, cause="exited with code 1"))
    assert decision.view.members == (1, 2) and decision.view.rank_of(1) == 0
    assert "killed by SIGKILL, then exited with code 1" in decision.line
    assert decision.line.endswith("original worker 1 is the new chief (rank 0)")
    # Renumbered: a later loss names the rank it had and its original one.
    later = m.decide(m.decide(decision.view, blame(2, rank=1)).view, blame(2, rank=1))
    assert later.view is None
    assert later.failed == (
        "mirrorkit: too few workers left: 1 of 3, below --min-workers 2; lost: worker 0 "
        "(localhost:23410): killed by SIGKILL, then exited with code 1; worker 1 (original "
        "rank 2, localhost:23412): killed by SIGKILL twice")


@pytest.mark.fast
def test_missing_hosts_are_lost_at_once_and_without_min_workers_nobody_is():
    m = Membership(world=4, min_workers=2)
    gone = [blame(2, cause="host c did not report within 5 s"),
            blame(3, cause="host c did not report within 5 s")]
    decision = m.decide(m.first_view(), None, gone)
    assert decision.view.members == (0, 1) and "2 of 4 workers (min 2)" in decision.line
    fixed = LocalAgreement(world=2)
    view = fixed.first_view()
    for _ in range(3):
        view = fixed.after_failure(view, blame(1), False).view
    assert view.members == (0, 1) and view.attempt == 3


# --- the rendezvous, three launchers' clients on loopback ---------------------

@pytest.fixture
def rendezvous():
    """Three launchers' clients (node 0's hosting), joined, on loopback; closed at the end."""
    base = consecutive_free_ports(40)
    spec = LaunchSpec(command=("x",), nproc=1, min_workers=2, max_restarts=2,
                      hosts=(f"localhost:{base}", f"localhost:{base + 10}",
                             f"localhost:{base + 20}"), rendezvous_timeout=2.0)
    wakes = [threading.Event() for _ in range(3)]
    clients: list[RendezvousClient] = [None] * 3  # type: ignore[list-item]

    def connect(node: int) -> None:
        clients[node] = RendezvousClient(dataclasses.replace(spec, node_rank=node), wakes[node])

    threads = [threading.Thread(target=connect, args=(n,)) for n in (2, 1, 0)]
    for thread in threads:      # node 0 (the host) starts last: the others retry
        thread.start()
    for thread in threads:
        thread.join(30)
    try:
        yield spec, clients, wakes
    finally:
        for client in clients:
            if client is not None:
                client.close()


@pytest.mark.fast
def test_rendezvous_agrees_on_a_shrunk_view_when_a_host_vanishes(rendezvous):
    spec, clients, wakes = rendezvous
    base = int(spec.hosts[0].rsplit(":", 1)[1])
    views = _all(lambda c: c.first_view(), clients)
    assert views == [View(0, (0, 1, 2))] * 3
    # Node 2's launcher dies: its connection closes without `done`.
    clients[2].close()
    decisions = _all(lambda c: c.after_failure(views[0], None, True), clients[:2])
    assert decisions[0] == decisions[1] and decisions[0].view.members == (0, 1)
    assert decisions[0].line.startswith(
        f"mirrorkit: worker 2 (localhost:{base + 20}) lost: host localhost lost its "
        "launcher; continuing with 2 of 3 workers (min 2)")
    # Node 2's launcher comes back: no rejoin, membership only shrinks in one job.
    back = RendezvousClient(dataclasses.replace(spec, node_rank=2), threading.Event())
    with pytest.raises(RuntimeError, match="node 2 joined after the job started; "
                                           "membership only shrinks within one job"):
        back.first_view()
    back.close()
    # Node 1's workers fail first: the host tells node 0 to stop its own.
    view = decisions[0].view
    for wake in wakes:
        wake.clear()
    started = time.monotonic()
    answer = {}
    report = threading.Thread(target=lambda: answer.update(
        d=clients[1].after_failure(view, Blame(1, 1, "x:1", "exited with code 1"), False)))
    report.start()
    assert wakes[0].wait(5) and clients[0].stop_requested(view.attempt)
    assert time.monotonic() - started < 2
    mine = clients[0].after_failure(view, None, True)
    report.join(10)
    assert mine == answer["d"] and mine.view == View(2, (0, 1), mine.view.reason)
    assert mine.view.reason == "attempt 2 failed: worker 1 (x:1) exited with code 1"


@pytest.mark.fast
def test_losing_the_rendezvous_host_fails_the_others_naming_it(rendezvous):
    spec, clients, _ = rendezvous
    view = _all(lambda c: c.first_view(), clients)[0]
    clients[0].close()   # node 0's launcher (and the rendezvous it hosts) is gone
    decisions = _all(lambda c: c.after_failure(view, None, True), clients[1:])
    host, port = spec.rendezvous_address()
    assert decisions[0] == decisions[1] and decisions[0].view is None
    assert decisions[0].failed.startswith(
        f"mirrorkit: lost the rendezvous at {host}:{port} (node 0, host {host}): without its "
        "host the launchers cannot agree on a membership, so this node stops")


def _all(call, clients) -> list:
    """``call(client)`` for every client at once (each blocks until the host answers)."""
    results: dict[int, object] = {}
    threads = [threading.Thread(target=lambda i=i, c=c: results.update({i: call(c)}))
               for i, c in enumerate(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return [results[i] for i in range(len(clients))]


# --- real launchers, real MultiWorkerMirroredStrategy workers ----------------

def run(tmp_path: Path, *args: str, timeout: float = 240) -> tuple[int, str]:
    """``mirrorkit launch ARGS`` to completion; its exit status and all its output."""
    proc = subprocess.run([*MAIN, "launch", "--grace-period", "1", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
                          env=clean_env(MIRRORKIT_COLLECTIVE_TIMEOUT="5"))
    return proc.returncode, proc.stdout + proc.stderr


def history(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """The last epoch of the same job on 3 workers, with no loss."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    code, output = run(tmp, "-n", "3", "--", "python", SCRIPT, str(tmp / "out"),
                       "--epochs", str(EPOCHS))
    assert code == 0, output[-3000:]
    return history(tmp / "out")[-1]


@pytest.mark.slow
@pytest.mark.parametrize("lost", [2, 0], ids=["worker", "chief"])
def test_a_worker_lost_for_good_finishes_on_two_with_every_epoch_once(
        tmp_path, lost, uninterrupted):
    out = tmp_path / "out"
    code, output = run(tmp_path, "-n", "3", "--min-workers", "2", "--max-restarts", "3", "--",
                       "python", SCRIPT, str(out), "--epochs", str(EPOCHS),
                       "--lose-rank", str(lost), "--lose-epoch", "2")
    assert code == 0, output[-4000:]
    line = next(x for x in output.splitlines() if "lost: " in x)
    assert f"worker {lost} (localhost:" in line and line.endswith(
        ("continuing with 2 of 3 workers (min 2)",
         "continuing with 2 of 3 workers (min 2); original worker 1 is the new chief (rank 0)"))
    assert "killed by SIGKILL, then exited with code 1" in line, line
    epochs = history(out)
    # Epoch 1 on 3 workers, backed up; the loss in epoch 2 cost a doomed retry
    # (restart 1); restart 2 resumed at epoch 2 on the 2 survivors.
    assert [(e["epoch"], e["workers"], e["restart"]) for e in epochs] == [
        (1, 3, 0), *[(n, 2, 2) for n in range(2, EPOCHS + 1)]]
    assert abs(epochs[-1]["accuracy"] - uninterrupted["accuracy"]) <= 0.02, (
        epochs[-1], uninterrupted)
    survivors = [r for r in range(3) if r != lost]
    assert not (out / f"env-{lost}-2.json").exists()   # a lost worker is not started again
    told = [json.loads((out / f"env-{r}-2.json").read_text()) for r in survivors]
    assert [t["rank"] for t in told] == [0, 1] and {t["workers"] for t in told} == {2}
    assert {t["reason"] for t in told} == {line.split("[launch] ", 1)[1]}
    assert {t["elastic_batch"] for t in told} == {"global"}
    assert "all 2 worker(s) succeeded" in output and "(2 restarts)" in output
    lost_at = float((out / f"lost-{lost}").read_text())
    back = float((out / "first-step-2.txt").read_text())
    print(f"\nloss of original worker {lost} -> training again on 2 workers: "
          f"{back - lost_at:.1f} s")


@pytest.mark.slow
def test_a_loss_below_min_workers_fails_naming_the_lost_worker(tmp_path):
    out = tmp_path / "out"
    code, output = run(tmp_path, "-n", "3", "--min-workers", "3", "--max-restarts", "3",
                       "--elastic-batch", "per-replica", "--", "python", SCRIPT, str(out),
                       "--epochs", str(EPOCHS), "--lose-rank", "1", "--lose-epoch", "1")
    assert code == 1, output[-4000:]
    summary = output[output.index("[launch] mirrorkit: too few workers left"):]
    assert summary.splitlines()[0] == (
        "[launch] mirrorkit: too few workers left: 2 of 3, below --min-workers 3; lost: "
        f"worker 1 (localhost:{_port_of(output, 1)}): killed by SIGKILL, then exited with "
        "code 1"), summary
    assert "FAILED after 1 restart(s)" in summary and "Traceback" not in output
    assert json.loads((out / "env-0-0.json").read_text())["elastic_batch"] == "per-replica"


def _port_of(output: str, rank: int) -> str:
    """The port worker ``rank`` had in the last attempt the launcher started."""
    starts = [x for x in output.splitlines() if "[launch] starting " in x]
    return starts[-1].split(": ", 1)[1].split(", ")[rank].rsplit(":", 1)[1]


@pytest.mark.parametrize("args, code, message", [
    (["--min-workers", "0"], 2,
     "Error: Invalid value for '--min-workers': 0 is not in the range"),
    (["--min-workers", "4"], 2, "Error: Invalid value for '--min-workers': 4 is more than "
                                "the 3 worker(s) the job starts with."),
    (["--min-workers", "two"], 2,
     "Error: Invalid value for '--min-workers': 'two' is not a valid"),
    (["--min-workers", "2", "--max-restarts", "1", "--elastic-batch", "both"], 2,
     "Error: Invalid value for '--elastic-batch': 'both' is not one of"),
    # Values fine alone that cannot work together: the spec's one line.
    (["--min-workers", "2"], 1, "Error: `min_workers` (--min-workers) continues after a loss "
                                "by restarting without the lost worker, so it needs"),
    (["--elastic-batch", "global"], 1, "Error: `elastic_batch` (--elastic-batch) only "
                                       "applies to an elastic job: add --min-workers M."),
])
def test_bad_elastic_flags_are_one_line(tmp_path, args, code, message):
    proc = subprocess.run([*MAIN, "launch", "-n", "3", *args, "--", "python", SCRIPT, "x"],
                          capture_output=True, text=True, timeout=60, env=clean_env(),
                          cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code and len(lines) == 1, proc.stderr
    assert lines[0].startswith(message), proc.stderr
