"""The sections of ``run.py`` added for issue 18: compare (3 arms), floor, run-speed, communication.

Every arm runs in fresh processes, alternated (A B C, C B A, ...), and every
speed ratio comes with the paired ratio (median of per-round ratios) and the
check that both arms reached the same validation accuracy within 0.01
(:func:`_harness.accuracy_check`); a ratio whose accuracies differ is flagged
in the table ("not counted: accuracy differs: 0.95 vs 0.93"), never hidden.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable, Sequence

from _harness import HERE, PY, accuracy_check, alternate, arm, ratio, run_command, run_script, shown

Log = Callable[[str], None]
SCRIPT = HERE / "communication.py"
Case = tuple[str, str, int, int]  # model, dataset, per-replica batch, epochs
# Goals of issue 18 for mirrorkit step time / floor.
FLOOR_GOAL = {"resnet20": 1.05, "cnn": 1.15}
# Default communication variants (communication.py --variant).
VARIANTS = ("auto", "ring", "pack-262144", "pack-1048576", "fp16", "bf16")


def _case_args(model: str, dataset: str, n: int, batch: int, epochs: int,
               extra: Sequence[str]) -> list[str]:
    return ["--model", model, "--dataset", dataset, "--replicas", str(n),
            "--per-replica-batch", str(batch), "--epochs", str(epochs), "--seed", "0",
            *(extra if dataset == "synthetic" else ())]


def compare(runs: int, epochs: int | None, cases: Sequence[Case], replicas: Sequence[int],
            log: Log, extra: Sequence[str] = (), ablation: bool = True) -> list[dict[str, Any]]:
    """Training img/s of the tutorial code (A), expert plain Keras (E) and mirrorkit (B).

    Ratios B/A, B/E and E/A (and, with ``ablation``, mirrorkit with its
    previous defaults / A), each with the accuracy check.
    """
    rows = []
    for model, dataset, batch, case_epochs in cases:
        for n in replicas:
            args = _case_args(model, dataset, n, batch, epochs or case_epochs, extra)
            log(f"compare: {model} on {dataset}, {n} replica(s), per-replica batch {batch}")
            scripts = {"baseline": ["baseline_keras.py"], "expert": ["expert_keras.py"],
                       "mirrorkit": ["mirrorkit_side.py"]}
            if ablation:
                scripts["previous"] = ["mirrorkit_side.py", "--previous-defaults"]
            calls = {name: (lambda s=s, args=args: run_script([HERE / s[0], *args, *s[1:]]))
                     for name, s in scripts.items()}
            got = alternate(runs, calls, log)
            arms = {name: arm(values) for name, values in got.items()}
            row = {"model": model, "dataset": dataset, "replicas": n, "per_replica_batch": batch,
                   "global_batch": batch * n, "epochs": epochs or case_epochs, "arms": arms,
                   "mirrorkit_vs_baseline": ratio(got, arms, "mirrorkit", "baseline"),
                   "mirrorkit_vs_expert": ratio(got, arms, "mirrorkit", "expert"),
                   "expert_vs_baseline": ratio(got, arms, "expert", "baseline"),
                   "target": ">= 1.0",
                   "command": "python benchmarks/{baseline_keras,expert_keras,mirrorkit_side}.py "
                              + " ".join(args)}
            if ablation:
                row["previous_vs_baseline"] = ratio(got, arms, "previous", "baseline")
            rows.append(row)
            log(f"  -> mirrorkit/baseline {row['mirrorkit_vs_baseline']}, "
                f"mirrorkit/expert {row['mirrorkit_vs_expert']}")
    return rows


def floor(runs: int, epochs: int | None, cases: Sequence[Case], replicas: Sequence[int],
          log: Log, extra: Sequence[str] = (), steps: int | None = None) -> list[dict[str, Any]]:
    """mirrorkit's median step time (step_timer) / the bare tf.function step (floor.py)."""
    rows = []
    for model, dataset, batch, case_epochs in cases:
        for n in replicas:
            args = _case_args(model, dataset, n, batch, epochs or case_epochs, extra)
            timed = steps or (400 if model == "cnn" else 60)
            floor_args = [*args[:8], "--steps", str(timed)]
            log(f"floor: {model} on {dataset}, {n} replica(s), per-replica batch {batch}")
            got = alternate(runs, {
                "floor": lambda a=floor_args: run_script([HERE / "floor.py", *a]),
                "mirrorkit": lambda a=args: run_script([HERE / "mirrorkit_side.py", *a])}, log)
            arms = {name: arm(values, "median_step_ms") for name, values in got.items()}
            r = ratio(got, arms, "mirrorkit", "floor", "median_step_ms")
            r.pop("accuracy_agrees"), r.pop("accuracy_note")  # the floor does not train to an end
            rows.append({"model": model, "dataset": dataset, "replicas": n,
                         "global_batch": batch * n, "arms": arms, **r,
                         "target": f"<= {FLOOR_GOAL.get(model, 1.05)}",
                         "command": f"python benchmarks/floor.py {' '.join(floor_args)}  vs  "
                                    f"python benchmarks/mirrorkit_side.py {' '.join(args)}"})
            log(f"  -> mirrorkit step / floor step {r['ratio']} (paired {r['paired_ratio']})")
    return rows


def run_speed(runs: int, epochs: int | None, models: Sequence[str], replicas: Sequence[int],
              log: Log, batch: int = 32) -> list[dict[str, Any]]:
    """plain_script.py under ``mirrorkit run`` (a), ``... --speed-up-fit`` (b), hand-ported (c)."""
    exe = shutil.which("mirrorkit", path=str(Path(PY).parent)) or "mirrorkit"
    rows = []
    for model in models:
        n_epochs = epochs or (8 if model == "cnn" else 4)
        for n in replicas:
            common = ["--model", model, "--epochs", str(n_epochs), "--seed", "0"]
            plain = [HERE / "plain_script.py", *common, "--batch-size", str(batch * n)]
            commands = {
                "run": [exe, "run", "--simulate-cpus", n, *plain],
                "run --speed-up-fit": [exe, "run", "--speed-up-fit", "--simulate-cpus", n, *plain],
                "ported": [PY, HERE / "plain_script_ported.py", "--replicas", n, *common,
                           "--batch-size", batch]}
            log(f"run-speed: plain_script.py {model}, {n} replica(s), global batch {batch * n}")
            got = alternate(runs, {k: (lambda c=c: run_command(c)) for k, c in commands.items()},
                            log)
            arms = {name: arm(values) for name, values in got.items()}
            rows.append({"model": model, "replicas": n, "global_batch": batch * n, "arms": arms,
                         "speed_up_fit_vs_ported": ratio(got, arms, "run --speed-up-fit", "ported"),
                         "run_vs_ported": ratio(got, arms, "run", "ported"),
                         "speed_up_fit_vs_run": ratio(got, arms, "run --speed-up-fit", "run"),
                         "commands": {k: " ".join(map(str, c)).replace(str(HERE.parent) + "/", "")
                                      for k, c in commands.items()}})
            log(f"  -> (b)/(c) {rows[-1]['speed_up_fit_vs_ported']}, "
                f"(a)/(c) {rows[-1]['run_vs_ported']}")
    return rows


def communication(runs: int, cases: Sequence[tuple[str, str, int, int]],
                  variants: Sequence[str], log: Log,
                  extra: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Step time of 2 loopback workers (per variant) / 2 independent processes, per model."""
    rows = []
    for model, dataset, batch, n_epochs in cases:
        args = ["--model", model, "--dataset", dataset, "--per-worker-batch", str(batch),
                "--epochs", str(n_epochs), *(extra if dataset == "synthetic" else ())]
        calls = {"2 independent": lambda a=args: run_script(
            [SCRIPT, *a, "--arm", "independent"])}
        for v in variants:
            calls[f"2 workers {v}"] = (lambda v=v, a=args: run_script(
                [SCRIPT, *a, "--arm", "workers", "--variant", v]))
        log(f"communication: {model} on {dataset}, per-worker batch {batch}, "
            f"variants {', '.join(variants)}")
        got = alternate(runs, calls, log)
        arms = {name: arm(values, "median_step_ms") for name, values in got.items()}
        reference = f"2 workers {variants[0]}"
        row: dict[str, Any] = {"model": model, "dataset": dataset, "per_worker_batch": batch,
                               "epochs": n_epochs, "arms": arms, "target": "<= 1.05",
                               "accuracy_reference": reference, "variants": {},
                               "command": f"python benchmarks/communication.py {' '.join(args)} "
                                          "--arm independent | --arm workers --variant V"}
        for v in variants:
            r = ratio(got, arms, f"2 workers {v}", "2 independent", "median_step_ms")
            # Accuracy: against the uncompressed reference variant (the
            # independent processes each train on half the data alone).
            r.update(accuracy_check(arms[f"2 workers {v}"], arms[reference]))
            row["variants"][v] = r
            log(f"  -> {v}: 2 workers / 2 independent {r['ratio']} (paired {r['paired_ratio']})"
                f"{', ' + r['accuracy_note'] if r['accuracy_note'] else ''}")
        rows.append(row)
    return rows


def summary_lines(record: dict[str, Any]) -> list[str]:
    """Markdown rows (| figure | A | B | ratio (paired) | target |) of the sections above."""
    lines = []

    def acc(a: dict[str, Any]) -> str:
        return f", acc {a['median_val_accuracy']}" if "median_val_accuracy" in a else ""

    for r in record.get("compare", []):
        a = r["arms"]
        case = (f"{r['model']} on {r['dataset']}, {r['replicas']} replica(s), global batch "
                f"{r['global_batch']}: training img/s")
        for key, b_name, a_name in (("mirrorkit_vs_baseline", "mirrorkit", "baseline"),
                                    ("mirrorkit_vs_expert", "mirrorkit", "expert"),
                                    ("expert_vs_baseline", "expert", "baseline"),
                                    ("previous_vs_baseline", "previous", "baseline")):
            if key in r:
                lines.append(f"| {case}, {b_name} / {a_name} | {a_name} "
                             f"{a[a_name]['median_images_per_sec']}{acc(a[a_name])} | {b_name} "
                             f"{a[b_name]['median_images_per_sec']}{acc(a[b_name])} | "
                             f"{shown(r[key])} | {r['target']} |")
    for r in record.get("floor", []):
        a = r["arms"]
        lines.append(f"| {r['model']}, {r['replicas']} replica(s), global batch "
                     f"{r['global_batch']}: mirrorkit step / floor step | floor "
                     f"{a['floor']['median_median_step_ms']} ms | mirrorkit "
                     f"{a['mirrorkit']['median_median_step_ms']} ms | **{r['ratio']}** "
                     f"({r['paired_ratio']}) | {r['target']} |")
    for r in record.get("run-speed", []):
        a = r["arms"]
        for key, b_name, a_name in (("speed_up_fit_vs_ported", "run --speed-up-fit", "ported"),
                                    ("run_vs_ported", "run", "ported")):
            lines.append(f"| plain_script.py {r['model']}, {r['replicas']} replica(s): "
                         f"`mirrorkit {b_name}` / hand port, img/s | {a_name} "
                         f"{a[a_name]['median_images_per_sec']}{acc(a[a_name])} | "
                         f"{a[b_name]['median_images_per_sec']}{acc(a[b_name])} | "
                         f"{shown(r[key])} | >= 1.0 |")
    for r in record.get("communication", []):
        a = r["arms"]
        for v, rv in r["variants"].items():
            w = a[f"2 workers {v}"]
            lines.append(f"| {r['model']} step time, 2 workers ({v}) / 2 independent processes "
                         f"| {a['2 independent']['median_median_step_ms']} ms | "
                         f"{w['median_median_step_ms']} ms{acc(w)} | {shown(rv)} | "
                         f"{r['target']} |")
    return lines
