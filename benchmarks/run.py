"""Run every mirrorkit benchmark and report ratios (see benchmarks/RESULTS.md).

Sections (each figure is a median over fresh processes; A and B alternate, and
the order flips every round, so drifting machine load hits both sides):

* ``compare``    -- training images/s: mirrorkit (``mirrorkit_side.py``) vs the
  hand-written tutorial code (``baseline_keras.py``) and vs the tutorial code
  tuned by an expert with stock Keras (``expert_keras.py``); ratios mirrorkit /
  baseline, mirrorkit / expert, expert / baseline, each counted only when the
  arms' final validation accuracies agree within 0.01 (else flagged). A fourth
  arm runs mirrorkit with its previous defaults (``--previous-defaults``: no
  core sharing, one step per call, synthetic data generated every epoch), an
  ablation that shows where mirrorkit's gain over the baseline comes from.
* ``pipeline``   -- images/s mirrorkit's default training pipeline produces with
  no model attached, vs the images/s training consumes; ratio produce / consume.
* ``startup``    -- ``mirrorkit --help`` wall time / ``python -c "import tensorflow"``.
* ``multiworker`` -- step time of 2 loopback workers / 1 worker at equal
  per-worker batch, every process with one intra-op thread (equal compute per
  worker on a 2-core machine), so the ratio is the all-reduce and
  synchronisation cost.
* ``floor``      -- mirrorkit's median step time / a bare ``tf.function`` train
  step on a fixed batch held on the devices (``floor.py``), per configuration.
* ``run-speed``  -- ``plain_script.py`` (an unmodified Keras script) under
  ``mirrorkit run`` (a) and ``mirrorkit run --speed-up-fit`` (b) vs the same
  script ported to MirroredStrategy by hand (c, ``plain_script_ported.py``);
  ratios b / c and a / c with accuracies.
* ``communication`` -- step time of 2 loopback workers / 2 independent
  processes doing the same work without communication (``communication.py``),
  per variant (RING, bytes_per_pack, fp16/bf16 gradient all-reduce), with each
  variant's final accuracy against the uncompressed one.

Full measurement on a quiet machine (2 cores; estimates at the defaults):
    python benchmarks/run.py --runs 5 --sections compare          # ~45 min (4 arms)
    python benchmarks/run.py --runs 5 --sections floor            # ~25 min
    python benchmarks/run.py --runs 5 --sections run-speed        # ~30 min
    python benchmarks/run.py --runs 3 --sections communication    # ~25 min
    python benchmarks/run.py --runs 5 --sections startup,pipeline # ~3 min

Example:
    python benchmarks/run.py                       # everything, 3 runs per side
    python benchmarks/run.py --sections startup --runs 7
    python benchmarks/run.py --quick               # smoke test: tiny settings
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sections as new_sections  # noqa: E402
from _harness import HERE, PY  # noqa: E402
from _harness import alternate as _alternate  # noqa: E402
from _harness import env as _env  # noqa: E402
from _harness import median as _median  # noqa: E402
from _harness import run_script as _run_script  # noqa: E402

SECTIONS = ("compare", "pipeline", "startup", "multiworker", "floor", "run-speed",
            "communication")

# (model, dataset, per-replica batch, epochs): the cases issue 7 asks for. The
# tiny cnn steps take milliseconds, so it gets more epochs: every run times
# at least ~150 steps (epoch 1 is warm-up and never timed).
CASES = (("cnn", "digits", 32, 8), ("resnet20", "synthetic", 32, 4))
REPLICAS = (1, 2)


# --------------------------------------------------------------------------
# sections
# --------------------------------------------------------------------------

def startup(runs: int, log: Callable[[str], None]) -> dict[str, Any]:
    """``mirrorkit --help`` wall time / ``python -c "import tensorflow"`` wall time."""
    exe = shutil.which("mirrorkit", path=str(Path(PY).parent)) or "mirrorkit"
    help_cmd = [exe, "--help"]
    tf_cmd = [PY, "-c", "import tensorflow"]

    def timed(cmd: list[str]) -> Callable[[], float]:
        def run() -> float:
            t0 = time.perf_counter()
            subprocess.run(cmd, capture_output=True, env=_env(), check=True)
            return round(time.perf_counter() - t0, 4)
        return run

    log("startup: mirrorkit --help vs python -c 'import tensorflow'")
    got = _alternate(runs, {"help": timed(help_cmd), "import tensorflow": timed(tf_cmd)}, log)
    help_s, tf_s = got["help"], got["import tensorflow"]
    ratio = _median(help_s) / _median(tf_s)
    return {"help_s": help_s, "import_tf_s": tf_s, "median_help_s": _median(help_s),
            "median_import_tf_s": _median(tf_s), "ratio": round(ratio, 4),
            "target": "<= 0.15",
            "command": f"{' '.join(help_cmd)}  vs  {' '.join(tf_cmd)}"}


def pipeline(runs: int, cases: Sequence[tuple[str, str, int, int]], replicas: int,
             consumption: dict[tuple[str, str, int], float] | None,
             log: Callable[[str], None], batches: int = 300) -> list[dict[str, Any]]:
    """Images/s of the default training pipeline alone vs training consumption."""
    rows = []
    for model, dataset, batch, _ in cases:
        args = ["--dataset", dataset, "--replicas", str(replicas),
                "--per-replica-batch", str(batch), "--batches", str(batches)]
        log(f"pipeline: {dataset}, global batch {batch * replicas}")
        produced = [_run_script([HERE / "pipeline.py", *args]) for _ in range(runs)]
        for i, r in enumerate(produced):
            log(f"    run {i + 1}: {r['images_per_sec']:.0f} img/s")
        p = _median([r["images_per_sec"] for r in produced])
        consume = (consumption or {}).get((model, dataset, replicas))
        rows.append({
            "dataset": dataset, "model": model, "replicas": replicas,
            "global_batch": batch * replicas, "pipeline_ips": [r["images_per_sec"] for r in produced],
            "median_pipeline_ips": round(p, 1),
            "training_ips": None if consume is None else round(consume, 1),
            "ratio": None if not consume else round(p / consume, 2), "target": ">= 3",
            "command": "python benchmarks/pipeline.py " + " ".join(args),
        })
        if consume:
            log(f"  -> pipeline {p:.0f} img/s, training {consume:.0f} img/s, ratio {p / consume:.1f}")
    return rows


def multiworker(runs: int, model: str, dataset: str, batch: int, steps: int,
                log: Callable[[str], None]) -> dict[str, Any]:
    """Step time of 2 loopback workers / 1 worker, equal per-worker batch and compute.

    Arms, every process with one intra-op thread: ``1 worker``;
    ``2 workers`` (MultiWorkerMirroredStrategy over loopback, via
    ``mirrorkit bench``); and the control ``2 independent``: the same two
    processes running at the same time without a cluster. On a 2-core machine
    shared with other jobs, 2 workers also suffer from CPU contention that 1
    worker does not see; the control has exactly that contention and no
    communication, so ``2 workers / 2 independent`` is the all-reduce and
    synchronisation cost alone. A fourth arm, ``1 worker, 1 core``, pins the
    single worker to one core: the share of the machine each of the 2 workers
    has, i.e. 2 one-core "machines" vs 1.
    """
    sys.path.insert(0, str(HERE.parent))
    from mirrorkit.bench import BenchConfig, Case, child_command, parse_result, run_bench

    def config(workers: tuple[int, ...]) -> BenchConfig:
        return BenchConfig(model=model, dataset=dataset, replicas=(1,), workers=workers,
                           steps=steps, warmup_steps=5, per_replica_batch=batch, threads=1)

    def cluster(workers: tuple[int, ...]) -> Callable[[], dict[str, Any]]:
        def run() -> dict[str, Any]:
            report = run_bench(config(workers))
            if report.failed:
                raise RuntimeError(report.failed[0].error)
            row = report.rows[-1]
            return {"images_per_sec": row.images_per_sec, "step_time_ms": row.step_time_ms}
        return run

    def solo(copies: int, cores: set[int] | None = None) -> list[dict[str, Any]]:
        cmd = child_command(config((1,)), Case(1, 1))
        pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=_env(), preexec_fn=pin) for _ in range(copies)]
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=1800)
            result = parse_result(out)
            if proc.returncode != 0 or result is None:
                raise RuntimeError(f"independent process failed: {err[-2000:]}")
            results.append(result)
        return results

    def independent() -> dict[str, Any]:
        results = solo(2)
        return {"images_per_sec": sum(r["images_per_sec"] for r in results),
                "step_time_ms": statistics.mean(r["step_time_ms"] for r in results)}

    def one_core() -> dict[str, Any]:
        # The resources each of the 2 workers has: half the machine.
        (result,) = solo(1, {sorted(os.sched_getaffinity(0))[0]})
        return {"images_per_sec": result["images_per_sec"], "step_time_ms": result["step_time_ms"]}

    log(f"multiworker: {model} on {dataset}, per-worker batch {batch}, 1 vs 2 workers")
    got = _alternate(runs, {"1 worker": cluster((1,)), "2 workers": cluster((2,)),
                            "2 independent": independent, "1 worker, 1 core": one_core}, log)
    med = {name: _median([r["step_time_ms"] for r in values]) for name, values in got.items()}
    return {
        "model": model, "dataset": dataset, "per_worker_batch": batch, "steps": steps,
        "step_ms_1_worker": [r["step_time_ms"] for r in got["1 worker"]],
        "step_ms_2_workers": [r["step_time_ms"] for r in got["2 workers"]],
        "step_ms_2_independent": [r["step_time_ms"] for r in got["2 independent"]],
        "median_step_ms_1_worker": med["1 worker"], "median_step_ms_2_workers": med["2 workers"],
        "median_step_ms_2_independent": round(med["2 independent"], 3),
        "ratio": round(med["2 workers"] / med["1 worker"], 3), "target": "<= 1.3",
        "ratio_vs_independent": round(med["2 workers"] / med["2 independent"], 3),
        "step_ms_1_worker_1_core": [r["step_time_ms"] for r in got["1 worker, 1 core"]],
        "median_step_ms_1_worker_1_core": round(med["1 worker, 1 core"], 3),
        "ratio_vs_1_core": round(med["2 workers"] / med["1 worker, 1 core"], 3),
        "command": (f"mirrorkit.bench.run_bench(BenchConfig(model={model!r}, dataset={dataset!r}, "
                    f"workers=(1,) vs (2,), per_replica_batch={batch}, steps={steps}, "
                    "threads=1)); control: 2 concurrent `python -m mirrorkit.bench --child` "
                    "without TF_CONFIG"),
    }


# --------------------------------------------------------------------------

def _machine() -> dict[str, Any]:
    sys.path.insert(0, str(HERE.parent))
    from mirrorkit.bench import machine_info

    return machine_info()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen sections and write a JSON record of every figure.

    Example:
        python benchmarks/run.py --sections compare,pipeline --runs 3
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {', '.join(SECTIONS)}")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per side (>= 3)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="epochs per training run (default: per case); epoch 1 is warm-up")
    parser.add_argument("--cases", default=None,
                        help="model:dataset:batch:epochs;... "
                        "(default: cnn:digits:32:8;resnet20:synthetic:32:4)")
    parser.add_argument("--replicas", default="1,2")
    parser.add_argument("--mw-cases", default="resnet20:synthetic:32;cnn:digits:32",
                        help="model:dataset:per-worker-batch;... for the multiworker section")
    parser.add_argument("--mw-steps", type=int, default=30)
    parser.add_argument("--comm-cases", default="cnn:digits:32:8;resnet20:synthetic:32:6",
                        help="model:dataset:per-worker-batch:epochs;... (communication)")
    parser.add_argument("--variants", default=",".join(new_sections.VARIANTS),
                        help="communication variants, the first is the accuracy reference "
                        "(see communication.py --variant)")
    parser.add_argument("--run-models", default="cnn,resnet20",
                        help="run-speed: plain_script.py --model values")
    parser.add_argument("--no-ablation", action="store_true",
                        help="compare: skip the 'mirrorkit with its previous defaults' arm")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 1 run, 2 epochs, few steps (numbers meaningless)")
    parser.add_argument("--output", default=str(HERE / "results.json"))
    opts = parser.parse_args(argv)
    sections = [s.strip() for s in opts.sections.split(",") if s.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; accepted: {', '.join(SECTIONS)}")
    cases = CASES
    if opts.cases:
        cases = tuple((m, d, int(b), int(e)) for m, d, b, e in
                      (c.split(":") for c in opts.cases.split(";")))
    replicas = tuple(int(r) for r in opts.replicas.split(","))
    runs, epochs, mw_steps = opts.runs, opts.epochs, opts.mw_steps
    comm_cases = tuple((m, d, int(b), int(e)) for m, d, b, e in
                       (c.split(":") for c in opts.comm_cases.split(";")))
    extra: list[str] = []
    floor_steps = None
    if opts.quick:
        runs, epochs, mw_steps, floor_steps = 1, 2, 10, 32
        extra = ["--limit", "256"]
        comm_cases = tuple((m, d, b, 2) for m, d, b, _ in comm_cases)

    def log(line: str) -> None:
        print(line, flush=True)

    record: dict[str, Any] = {"machine": _machine(), "runs": runs, "epochs": epochs,
                              "argv": list(argv if argv is not None else sys.argv[1:])}
    started = time.time()
    if "startup" in sections:
        record["startup"] = startup(max(runs, 5) if not opts.quick else 1, log)
    if "compare" in sections:
        record["compare"] = new_sections.compare(runs, epochs, cases, replicas, log, extra,
                                                 ablation=not opts.no_ablation)
    if "pipeline" in sections:
        consumption = {(r["model"], r["dataset"], r["replicas"]):
                       r["arms"]["mirrorkit"]["median_images_per_sec"]
                       for r in record.get("compare", [])}
        record["pipeline"] = pipeline(runs, cases, 1, consumption, log,
                                      batches=50 if opts.quick else 300)
    if "multiworker" in sections:
        mw_cases = tuple((m, d, int(b)) for m, d, b in
                         (c.split(":") for c in opts.mw_cases.split(";")))
        record["multiworker"] = [multiworker(runs, m, d, b, mw_steps, log) for m, d, b in mw_cases]
    if "floor" in sections:
        record["floor"] = new_sections.floor(runs, epochs, cases, replicas, log, extra,
                                             steps=floor_steps)
    if "run-speed" in sections:
        record["run-speed"] = new_sections.run_speed(runs, epochs, opts.run_models.split(","),
                                                     replicas, log)
    if "communication" in sections:
        record["communication"] = new_sections.communication(
            runs, comm_cases, [v.strip() for v in opts.variants.split(",")], log, extra)
    record["wall_s"] = round(time.time() - started, 1)
    record["load_average_end"] = list(os.getloadavg())
    Path(opts.output).write_text(json.dumps(record, indent=2) + "\n")
    log(f"wrote {opts.output}")
    log(summary(record))
    return 0


def summary(record: dict[str, Any]) -> str:
    """Markdown table of every ratio in ``record`` (for RESULTS.md)."""
    lines = ["| figure | A | B | ratio (paired) | target |", "|---|---|---|---|---|"]
    lines += new_sections.summary_lines(record)
    for r in record.get("pipeline", []):
        lines.append(f"| {r['dataset']} pipeline img/s vs {r['model']} training img/s "
                     f"(global batch {r['global_batch']}) | pipeline {r['median_pipeline_ips']} | "
                     f"training {r['training_ips']} | **{r['ratio']}** | {r['target']} |")
    if "startup" in record:
        r = record["startup"]
        lines.append(f"| `mirrorkit --help` / `import tensorflow` wall time | "
                     f"{r['median_help_s']:.3f} s | {r['median_import_tf_s']:.3f} s | "
                     f"**{r['ratio']}** | {r['target']} |")
    for r in record.get("multiworker", []):
        lines.append(f"| step time 2 workers / 1 worker ({r['model']}, per-worker batch "
                     f"{r['per_worker_batch']}) | {r['median_step_ms_1_worker']} ms | "
                     f"{r['median_step_ms_2_workers']} ms | **{r['ratio']}** | {r['target']} |")
        lines.append(f"| step time 2 workers / 2 independent processes (same contention, no "
                     f"all-reduce; {r['model']}) | {r['median_step_ms_2_independent']} ms | "
                     f"{r['median_step_ms_2_workers']} ms | **{r['ratio_vs_independent']}** | "
                     f"{r['target']} |")
        lines.append(f"| step time 2 workers / 1 worker pinned to 1 core (each worker's share of "
                     f"the machine; {r['model']}) | {r['median_step_ms_1_worker_1_core']} ms | "
                     f"{r['median_step_ms_2_workers']} ms | **{r['ratio_vs_1_core']}** | "
                     f"{r['target']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
