"""``mirrorkit bench --input-only``: the training input pipeline alone, beside the decode floor.

Up to four arms read the same training files in one process, no model:

* ``pipeline``: exactly what ``mirrorkit train`` feeds ``fit`` for this
  dataset, image size, batch and augmentation
  (:func:`mirrorkit.data.train_pipeline` with the dataset's ``map_fn``, repeated);
* ``decode``: the decode floor, the fastest plain TensorFlow path to the
  same pixels: read, then ``decode_jpeg`` (or ``decode_and_crop_jpeg`` at the
  same kind of window), nothing else; what the CPU can decode;
* ``whole`` (``--augment crop`` only): read + ``decode_jpeg`` of each whole
  file: the files' decode floor, what a pipeline that decodes before it crops
  starts from (without ``crop``, ``decode`` is this already);
* ``plain``: ``decode`` + the bilinear resize to the image size + batch: the
  least any pipeline must do to hand ``fit`` a batch (TensorFlow's resize of
  a crop to 224x224 costs about a third of a JPEG decode on its own);
* ``tutorial`` (``folder:`` only): ``keras.utils.image_dataset_from_directory``
  at the same image size and batch, with ``prefetch`` as the TensorFlow
  tutorial adds (no ``cache``: that would time memory, not decoding).

Each round times every arm for ``batches`` batches after ``warmup_batches``;
rounds alternate the order (A B C, C B A, ...) so a neighbour's load on the
shared cores falls on every arm alike, and the median round is reported.
Besides images/s the report gives images per CPU-second of this process
(``time.process_time`` over the timed batches): the per-core rate, which
other processes' load does not dilute, and the figure "cores per GPU" is
computed from.

Example:
    >>> config = InputBenchConfig(dataset="folder:photos", image_size=224, augment="crop")
    >>> report = run_input_bench(config)            # doctest: +SKIP
    >>> round(report["ratios"]["pipeline_to_plain_per_cpu_second"], 2)   # doctest: +SKIP
    0.95
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable

from mirrorkit.errors import UserInputError

#: Data augmentations ``--augment`` names (``flip-shift`` runs inside the
#: model, so its input pipeline is the ``none`` one; so does ``crop``'s flip).
AUGMENTS = ("none", "flip-shift", "crop")
ARMS = ("pipeline", "plain", "decode", "whole", "tutorial")
#: The arms every other is divided by, strictest first.
FLOORS = ("decode", "whole", "plain")


@dataclasses.dataclass(frozen=True)
class InputBenchConfig:
    """What ``mirrorkit bench --input-only`` measures.

    Attributes:
        dataset: ``folder:PATH`` or ``files:GLOB`` (encoded images).
        image_size: N or ``"HxW"``. Defaults to 224.
        batch: images per batch (``train``'s global batch). Defaults to 64.
        augment: ``none``, ``flip-shift`` or ``crop``, as ``train --augment``.
            Defaults to ``"none"``.
        cache: as ``train --cache``. Defaults to False.
        batches: timed batches per arm and round. Defaults to 30.
        warmup_batches: untimed batches first. Defaults to 5.
        rounds: alternated rounds. Defaults to 3.
        seed: shuffle and crop seed. Defaults to 0.
        tutorial: also time ``image_dataset_from_directory`` (``folder:``
            only). Defaults to True.

    Raises:
        UserInputError: for a dataset that is not encoded images, or a bad number.

    Example:
        >>> InputBenchConfig(dataset="folder:photos").image_size
        (224, 224)
        >>> InputBenchConfig(dataset="digits")
        Traceback (most recent call last):
        ...
        mirrorkit.errors.UserInputError: --input-only times decoding encoded images: the dataset must be folder:PATH or files:GLOB. Received: dataset='digits'
    """

    dataset: str
    image_size: Any = 224
    batch: int = 64
    augment: str = "none"
    cache: bool = False
    batches: int = 30
    warmup_batches: int = 5
    rounds: int = 3
    seed: int = 0
    tutorial: bool = True

    def __post_init__(self) -> None:
        from mirrorkit._checks import check_positive_int
        from mirrorkit.datasets import normalize_image_size, parse_spec

        if parse_spec(self.dataset)[0] not in ("folder", "files"):
            raise UserInputError("--input-only times decoding encoded images: the dataset must be "
                                 f"folder:PATH or files:GLOB. Received: dataset={self.dataset!r}")
        object.__setattr__(self, "image_size", normalize_image_size(self.image_size))
        if self.augment not in AUGMENTS:
            raise UserInputError(f"Unknown augment. Valid: {', '.join(AUGMENTS)}. "
                                 f"Received: augment={self.augment!r}")
        for name in ("batch", "batches", "rounds"):
            check_positive_int(name, getattr(self, name))
        if self.warmup_batches:
            check_positive_int("warmup_batches", self.warmup_batches)

    @property
    def data_augment(self) -> str:
        """The augmentation of the input pipeline (``flip-shift`` is the model's)."""
        return "crop" if self.augment == "crop" else "none"


def cores() -> int:
    """CPU cores this process may run on.

    Example:
        >>> cores() >= 1
        True
    """
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _pipeline(config: InputBenchConfig, data: Any) -> Any:
    from mirrorkit.data import resolve_batch, train_pipeline

    # As training.job builds it: one worker, the dataset's own map_fn.
    return train_pipeline(data.train, batch=resolve_batch(global_batch=config.batch, replicas=1),
                          seed=config.seed, map_fn=data.map_fn, num_files=data.train_files,
                          num_workers=1).repeat()


def _decoded(config: InputBenchConfig, data: Any, then: Callable[[Any], Any]) -> Any:
    """The training files decoded in the same windows, each passed to ``then``."""
    import tensorflow as tf

    from mirrorkit.data.pipelines import seeded_map

    decoder = data.map_fn
    if decoder.train_fn is None:
        return data.train.map(lambda x, y: then(decoder.window(x)),
                              num_parallel_calls=tf.data.AUTOTUNE)
    # Seeded as the pipeline is.
    return seeded_map(data.train, config.seed,
                      lambda example, pair: then(decoder.window(example[0], pair)))


def _decode(config: InputBenchConfig, data: Any) -> Any:
    import tensorflow as tf

    # Shapes, not pixels: the decoded images differ in size, and only
    # reading and decoding are timed.
    ds = _decoded(config, data, tf.shape)
    return ds.batch(config.batch).prefetch(tf.data.AUTOTUNE).repeat()


def _whole(config: InputBenchConfig, data: Any) -> Any:
    import tensorflow as tf

    ds = data.train.map(lambda x, label: tf.shape(data.map_fn.whole(x)),
                        num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(config.batch).prefetch(tf.data.AUTOTUNE).repeat()


def _plain(config: InputBenchConfig, data: Any) -> Any:
    import tensorflow as tf

    ds = _decoded(config, data, data.map_fn.resize)
    return ds.batch(config.batch).prefetch(tf.data.AUTOTUNE).repeat()


def _tutorial(config: InputBenchConfig, data: Any) -> Any:
    import keras
    import tensorflow as tf

    root = Path(config.dataset.partition(":")[2]).expanduser()
    split: dict[str, Any] = {}
    if (root / "train").is_dir() and (root / "val").is_dir():
        root = root / "train"
    else:
        split = {"validation_split": 0.2, "subset": "training"}
    # Keras prints "Found N files ..." on stdout, which is the report's.
    with contextlib.redirect_stdout(io.StringIO()):
        ds = keras.utils.image_dataset_from_directory(
            root, image_size=config.image_size, batch_size=config.batch, seed=config.seed,
            color_mode="grayscale" if data.image_shape[2] == 1 else "rgb", **split)
    return ds.prefetch(tf.data.AUTOTUNE).repeat()


def _time(ds: Any, warmup: int, batches: int) -> dict[str, float]:
    iterator = iter(ds)
    for _ in range(warmup):
        next(iterator)
    images = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        first = next(iterator)
        while isinstance(first, (tuple, list)):
            first = first[0]
        images += int(first.shape[0])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"images": images, "seconds": wall, "cpu_seconds": cpu,
            "images_per_sec": images / wall, "images_per_cpu_sec": images / cpu if cpu else None}


def _describe(config: InputBenchConfig, data: Any) -> dict[str, str]:
    decode = ("read + decode_and_crop_jpeg of a random-resized-crop window"
              if config.data_augment == "crop" else "read + decode_jpeg of the whole image")
    return {
        "pipeline": f"mirrorkit train's pipeline ({data.map_fn.describe()}; shuffle, resize, "
                    "batch, prefetch)",
        "plain": f"{decode} + resize + batch: the plainest path to a batch",
        "decode": f"{decode} alone: the decode floor",
        "whole": "read + decode_jpeg of the whole image alone: the files' decode floor",
        "tutorial": "keras.utils.image_dataset_from_directory + prefetch (whole image resized)",
    }


def run_input_bench(config: InputBenchConfig,
                    progress: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """Time the arms (see the module docstring); return the JSON-ready report.

    Args:
        config: what to measure.
        progress: called with a line per arm and round (e.g. ``print``).

    Returns:
        ``{"config", "machine", "cores", "dataset", "arms", "ratios"}``: per
        arm its rounds and median ``images_per_sec`` / ``images_per_cpu_sec``;
        ratios of every arm to ``decode``, ``whole`` (when timed) and
        ``plain`` (by wall time and per CPU-second).

    Raises:
        FileNotFoundError / ValueError: the dataset cannot be read (one line).

    Example:
        >>> report = run_input_bench(InputBenchConfig(dataset="folder:photos"))  # doctest: +SKIP
    """
    from mirrorkit import datasets
    from mirrorkit.bench.runs import machine_info

    say = progress or (lambda line: None)
    # uint8 pixels, as train loads encoded images (TrainConfig.load_options).
    data = datasets.load(config.dataset, datasets.DataOptions(
        image_size=config.image_size, augment=config.data_augment, cache=config.cache,
        uint8=True))
    builders = {"pipeline": _pipeline, "plain": _plain, "decode": _decode, "whole": _whole,
                "tutorial": _tutorial}
    wanted = {"tutorial": config.tutorial and config.dataset.startswith("folder:"),
              "whole": config.data_augment == "crop"}
    arms = [a for a in ARMS if wanted.get(a, True)]
    pipelines = {arm: builders[arm](config, data) for arm in arms}
    rounds: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
    for index in range(config.rounds):
        for arm in arms if index % 2 == 0 else arms[::-1]:
            result = _time(pipelines[arm], config.warmup_batches, config.batches)
            rounds[arm].append(result)
            say(f"round {index + 1}/{config.rounds} {arm:9s} "
                f"{result['images_per_sec']:8.1f} images/s  "
                f"{result['images_per_cpu_sec'] or 0:8.1f} images/CPU-s")
    descriptions = _describe(config, data)
    summary = {arm: {
        "description": descriptions[arm],
        "images_per_sec": statistics.median(r["images_per_sec"] for r in rounds[arm]),
        "images_per_cpu_sec": statistics.median(r["images_per_cpu_sec"] or 0.0
                                                for r in rounds[arm]),
        "rounds": rounds[arm],
    } for arm in arms}
    n = cores()
    for arm in arms:
        summary[arm]["images_per_sec_per_core"] = summary[arm]["images_per_sec"] / n
    ratios = {}
    for arm in arms:
        for floor in (f for f in FLOORS if f in arms):
            if arm in (floor, "decode"):
                continue
            ratios[f"{arm}_to_{floor}"] = (summary[arm]["images_per_sec"]
                                           / summary[floor]["images_per_sec"])
            ratios[f"{arm}_to_{floor}_per_cpu_second"] = (
                summary[arm]["images_per_cpu_sec"] / summary[floor]["images_per_cpu_sec"]
                if summary[floor]["images_per_cpu_sec"] else None)
    return {"config": {**dataclasses.asdict(config), "image_size": list(config.image_size)},
            "machine": machine_info(), "cores": n, "dataset": data.summary(),
            "arms": summary, "ratios": ratios}


def table(report: dict[str, Any]) -> str:
    """The report as text: one line per arm, then the ratios per CPU-second.

    Example:
        >>> print(table(report))                      # doctest: +SKIP
        arm        images/s  images/s/core  images/CPU-s  /decode  /plain  what
        decode        301.2          150.6         152.0     1.00    1.35  read + ...
    """
    arms = report["arms"]
    floors = [f for f in FLOORS if f in arms]
    lines = [f"{'arm':9s} {'images/s':>9s} {'images/s/core':>14s} {'images/CPU-s':>13s} "
             + " ".join(f"{'/' + f:>7s}" for f in floors) + "  what (ratios per CPU-second)"]
    for arm, row in arms.items():
        ratios = [row["images_per_cpu_sec"] / arms[floor]["images_per_cpu_sec"]
                  if arms[floor]["images_per_cpu_sec"] else 0.0 for floor in floors]
        lines.append(f"{arm:9s} {row['images_per_sec']:9.1f} "
                     f"{row['images_per_sec_per_core']:14.1f} {row['images_per_cpu_sec']:13.1f} "
                     + " ".join(f"{r:7.2f}" for r in ratios) + f"  {row['description']}")
    config = report["config"]
    lines.append(f"({report['cores']} cores; median of {config['rounds']} alternated rounds of "
                 f"{config['batches']} batches of {config['batch']}; images/s/core = images/s "
                 "/ cores, images/CPU-s = images per second of this process's CPU time)")
    return "\n".join(lines)
