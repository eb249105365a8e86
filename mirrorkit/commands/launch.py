"""``mirrorkit launch``: run N workers of a command as one TF_CONFIG cluster."""

from __future__ import annotations

import logging

import click

from mirrorkit.commands._common import logging_to, user_errors
from mirrorkit.errors import UserInputError
from mirrorkit.protocol import ELASTIC_BATCH_CHOICES


class _LauncherLog(logging.Handler):
    """The launcher's own messages on stderr as ``[launch] ...`` lines."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(f"[launch] {record.getMessage()}", err=True)


@click.command(context_settings={"ignore_unknown_options": True,
                                 "allow_interspersed_args": False})
@click.option("-n", "--nproc", type=int, default=None, metavar="N",
              help="Workers to start on this machine (required).")
@click.option("--max-restarts", type=int, default=0, show_default=True,
              help="Restart the whole group up to this many times after a failure.")
@click.option("--log-dir", type=click.Path(file_okay=False), default=None,
              help="Also append each worker's output to DIR/worker-<rank>.log "
              "(its rank in the first attempt).")
@click.option("--port", type=int, default=None,
              help="First of N consecutive ports (an error if one is in use). "
              "Default: free ports, new ones on each restart.")
@click.option("--gpus-per-worker", type=int, default=None, metavar="G",
              help="Give each worker its own G GPUs via CUDA_VISIBLE_DEVICES.")
@click.option("--grace-period", type=float, default=3.0, show_default=True,
              help="Seconds between SIGTERM and SIGKILL when stopping workers "
              "(TensorFlow workers ignore SIGTERM, so every stop waits this long).")
@click.option("--hosts", default=None, metavar="H1,H2,...",
              help="Multi-node: every node's HOST or HOST:PORT in node-rank order; "
              "run the same command on each node with its --node-rank.")
@click.option("--node-rank", type=int, default=0, show_default=True,
              help="Multi-node: this node's position in --hosts.")
@click.option("--expose-network", is_flag=True,
              help="One machine only: let the workers' TensorFlow servers listen on every "
              "network interface, as plain TensorFlow does. They are unauthenticated: anyone "
              "who can reach this machine can send them graph operations while the job runs. "
              "Default: they run in a private network namespace, reachable on its loopback "
              "only (HTTP(S) downloads still work through the launcher).")
@click.option("--min-workers", type=click.IntRange(min=1), default=None, metavar="M",
              help="Elastic training: a worker that fails again right after its restart "
              "(the first to fail in two attempts in a row), or whose host stops answering "
              "the rendezvous, is lost, and the group restarts without it, ranks renumbered "
              "(a new chief if worker 0 was lost), while at least M workers (over all "
              "hosts) remain. Below M the job fails naming the lost workers. A lost worker "
              "does not rejoin: membership only shrinks within one job. Needs "
              "--max-restarts >= 1 (2 to survive a worker lost on one machine).")
@click.option("--elastic-batch", type=click.Choice(ELASTIC_BATCH_CHOICES), default=None,
              help="With --min-workers: what the workers keep when their number changes, "
              "passed as MIRRORKIT_ELASTIC_BATCH: the global batch (default) or the "
              "per-replica batch.")
@click.option("--rendezvous-timeout", type=float, default=30.0, show_default=True,
              metavar="SECONDS",
              help="Multi-host with --min-workers: after the first host reports a failed "
              "attempt, how long the rendezvous (hosted by --node-rank 0's launcher on its "
              "first port + N) waits for the others; a host silent by then is lost. If "
              "node 0's host is the one lost, the others fail, naming it: there is no "
              "successor.")
@click.option("--oversubscribe", is_flag=True,
              help="Start -n workers even when this machine cannot hold them usefully: "
              "more than 4 per core, or more than its available memory at about 0.7 GB "
              "per TensorFlow worker. Without it such a launch is refused in one line. "
              "Example: mirrorkit launch -n 12 --oversubscribe -- python train.py")
@click.option("--ray", "ray_address", is_flag=False, flag_value="auto", default=None,
              metavar="[ADDRESS]",
              help="Run the workers on a Ray cluster through Ray Train "
              "(needs pip install \"mirrorkit[ray]\"): ADDRESS is its head's HOST:PORT, or "
              "auto (the default: RAY_ADDRESS, else the cluster started on this machine). "
              "--max-restarts, --min-workers and --gpus-per-worker map to Ray Train's. "
              "Example: mirrorkit launch --ray auto -n 2 -- mirrorkit train --output /shared/a")
@click.option("--cpus-per-worker", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="C", help="With --ray: Ray CPUs each worker reserves (also its "
              "intra-op threads). Default: 1.")
@click.option("--storage", default=None, metavar="PATH",
              help="With --ray: Ray Train's storage path for its records and the final "
              "checkpoint, seen by every node. Default: Ray's ~/ray_results.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def launch(nproc: int | None, max_restarts: int, log_dir: str | None, port: int | None,
           gpus_per_worker: int | None, grace_period: float, hosts: str | None,
           node_rank: int, expose_network: bool, min_workers: int | None,
           elastic_batch: str | None, rendezvous_timeout: float, oversubscribe: bool,
           ray_address: str | None, cpus_per_worker: float | None, storage: str | None,
           command: tuple[str, ...]) -> None:
    """Run COMMAND as N workers of one multi-worker cluster, restarting on failure.

    Each worker gets its TF_CONFIG (worker 0 is the chief),
    MIRRORKIT_RESTART_COUNT, MIRRORKIT_ORIGINAL_RANK (its rank in the first
    attempt) and, after a restart, MIRRORKIT_RESTART_REASON (one line); its
    output is shown live, prefixed "[rank] ". When a worker fails the others
    are stopped and, while --max-restarts allow, the whole group starts
    again (resume with a backup callback). With --min-workers it may restart
    with fewer workers (see below). Ctrl-C stops every worker. Exit status:
    0; the failed worker's status (128+N for signal N); 130/143 when
    interrupted. The job's private folders (one scratch root in the temp
    dir, MIRRORKIT_SCRATCH_DIR) are removed on any end. More workers than
    this machine holds usefully (4 per core, ~0.7 GB each) are refused
    unless --oversubscribe.

    \b
    Examples:
      mirrorkit launch -n 2 -- mirrorkit train --epochs 3
      mirrorkit launch -n 2 --max-restarts 3 --log-dir logs -- python apps/multi_worker.py --output out
      # two machines, 2 workers each (run on both, --node-rank 0 and 1):
      mirrorkit launch -n 2 --hosts node1,node2 --port 23456 --node-rank 0 -- python train.py
      # elastic: 3 workers, continue on 2 if one is lost for good:
      mirrorkit launch -n 3 --min-workers 2 --max-restarts 3 -- mirrorkit train --epochs 10
      # on a Ray cluster (ray start --head), output on storage every node sees:
      mirrorkit launch --ray auto -n 2 --max-restarts 2 -- mirrorkit train --output /shared/a
    """
    from mirrorkit.launcher import LaunchSpec
    from mirrorkit.launcher import launch as run

    with user_errors():
        if nproc is None:
            raise UserInputError("Missing -n/--nproc: the number of workers to start, "
                                 "e.g. 'mirrorkit launch -n 2 -- python train.py'.")
        if not command:
            raise UserInputError("Missing the command to run, e.g. "
                                 "'mirrorkit launch -n 2 -- python train.py'.")
        if ray_address is not None:
            _on_ray(ray_address, nproc, command, max_restarts, gpus_per_worker,
                    cpus_per_worker, min_workers, elastic_batch, storage)
        elif cpus_per_worker is not None or storage is not None:
            raise click.UsageError("--cpus-per-worker and --storage apply to --ray jobs only.")
        world = nproc * (len(hosts.split(",")) if hosts else 1)
        if min_workers is not None and nproc > 0 and min_workers > world:
            raise click.BadParameter(
                f"{min_workers} is more than the {world} worker(s) the job starts with.",
                param_hint="'--min-workers'")
        spec = LaunchSpec(command=command, nproc=nproc, max_restarts=max_restarts,
                          log_dir=log_dir, port=port, gpus_per_worker=gpus_per_worker,
                          grace_period=grace_period,
                          hosts=None if hosts is None else tuple(
                              h.strip() for h in hosts.split(",") if h.strip()),
                          node_rank=node_rank, expose_network=expose_network,
                          min_workers=min_workers, elastic_batch=elastic_batch,
                          rendezvous_timeout=rendezvous_timeout,
                          oversubscribe=oversubscribe)
        with _launcher_log():
            result = run(spec)
    click.echo(f"[launch] {result.summary()}", err=True)
    click.get_current_context().exit(result.exit_code)


# Options a Ray job does not take: Ray places, connects and watches the workers.
_LOCAL_ONLY = ("log_dir", "port", "grace_period", "hosts", "node_rank", "expose_network",
               "rendezvous_timeout", "oversubscribe")


def _on_ray(address: str, nproc: int, command: tuple[str, ...], max_restarts: int,
            gpus: int | None, cpus: float | None, min_workers: int | None,
            elastic_batch: str | None, storage: str | None) -> None:
    """``--ray``: run the job through Ray Train (:mod:`mirrorkit.launcher.ray_job`), then exit."""
    from click.core import ParameterSource

    from mirrorkit.launcher.ray_job import RayJobSpec, run

    ctx = click.get_current_context()
    given = [f"--{name.replace('_', '-')}" for name in _LOCAL_ONLY
             if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT]
    if given:
        raise click.UsageError(f"{', '.join(given)} cannot be used with --ray: Ray places, "
                               "connects and stops the workers. Accepted with --ray: -n, "
                               "--max-restarts, --min-workers, --elastic-batch, "
                               "--gpus-per-worker, --cpus-per-worker, --storage.")
    spec = RayJobSpec(command=command, nproc=nproc, address=address,
                      cpus_per_worker=cpus or 1.0, gpus_per_worker=gpus or 0,
                      max_restarts=max_restarts, min_workers=min_workers,
                      elastic_batch=elastic_batch, storage=storage)
    with _launcher_log():
        result = run(spec)
    click.echo(f"[launch] {result.summary()}", err=True)
    ctx.exit(result.exit_code)


def _launcher_log():
    """The launcher's log records on stderr as ``[launch] ...`` lines while in the block."""
    return logging_to("mirrorkit.launcher", _LauncherLog())
