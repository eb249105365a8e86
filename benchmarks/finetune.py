"""Fine-tuning a pretrained keras.applications backbone vs training it from scratch, on JPEG folders.

There is no real photo data set offline, so "pretrained" is made here, honestly
smaller than ImageNet: two folders of photo-like JPEGs (300-600 px a side,
gradients, blotches, sensor noise; tools/make_jpeg_folder.py) whose classes are
the shapes drawn on them.

* pretraining folder: 2 classes (rings, crosses);
* target folder: the 4 other shapes (ellipses, boxes, triangles, stripes), other
  images (another seed).

The backbone is pretrained from scratch on the first folder with ``mirrorkit
train``. A short scratch run leaves BatchNormalization's moving statistics
behind its weights (in inference mode its features were nearly constant), so
they are then recomputed on the pretraining folder with the weights fixed
("precise BN": training-mode passes, momentum 0.9) and the backbone saved as
``pretrained-backbone.weights.h5``: the ``--weights`` of a fine-tuning run on
the target folder, against a run from random weights with the same model,
folder, epochs and seed. The fine-tuning run is repeated on 2 replicas
(``--simulate-cpus 2``). Each run's metrics.json is summarised in one line and
the whole in ``--json``.

Example:
    python benchmarks/finetune.py --root benchmarks/data --model mobilenet_025 --image-size 96
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _pretrain_folder(root: Path, images: int, seed: int) -> Path:
    folder = root / f"finetune-pretrain{images}"
    if folder.is_dir():
        return folder
    sys.path.insert(0, str(REPO / "tools"))
    import numpy as np
    from make_jpeg_folder import CLASS_NAMES, make_image

    rng = np.random.default_rng(seed)
    labels = (4, 5)  # rings, crosses: shapes the target folder never shows
    for label in labels:
        (folder / CLASS_NAMES[label]).mkdir(parents=True, exist_ok=True)
    for i in range(images):
        label = labels[i % len(labels)]
        make_image(label, rng).save(folder / CLASS_NAMES[label] / f"{i:05d}.jpg", quality=90)
    return folder


def _target_folder(root: Path, images: int, seed: int) -> Path:
    folder = root / f"finetune-target{images}"
    if not folder.is_dir():
        subprocess.run([sys.executable, str(REPO / "tools" / "make_jpeg_folder.py"), str(folder),
                        "--images", str(images), "--classes", "4", "--seed", str(seed)],
                       check=True)
    return folder


def _train(name: str, out: Path, args: argparse.Namespace, *extra: str) -> dict:
    run = out / name
    if not (run / "metrics.json").exists():
        command = [sys.executable, "-m", "mirrorkit", "train", "--model", args.model,
                   "--image-size", str(args.image_size), "--output", str(run),
                   "--seed", str(args.seed), *extra]
        print("$ " + " ".join(command[1:]), flush=True)
        started = time.monotonic()
        subprocess.run(command, check=True)
        print(f"  ({time.monotonic() - started:.0f} s)", flush=True)
    metrics = json.loads((run / "metrics.json").read_text())
    keep = ("val_accuracy", "val_loss", "epochs", "replicas", "global_batch", "learning_rate",
            "images_per_second", "wall_time_seconds", "fine_tune", "train_examples",
            "val_examples")
    return {"name": name, **{k: metrics.get(k) for k in keep}}


def _backbone_file(run: Path, folder: Path, image_size: int) -> Path:
    """The pretrained run's backbone, its BatchNormalization statistics recomputed, as a file."""
    path = run.parent / "pretrained-backbone.weights.h5"
    if path.exists():
        return path
    import keras

    model = keras.models.load_model(run / "model.keras", compile=False)
    backbone = model.get_layer("backbone")
    norms = [layer for layer in backbone.layers
             if isinstance(layer, keras.layers.BatchNormalization)]
    for layer in norms:
        layer.momentum = 0.9
    data = keras.utils.image_dataset_from_directory(
        str(folder), image_size=(image_size, image_size), batch_size=64, shuffle=True, seed=0,
        verbose=False)
    for _ in range(3):
        for images, _labels in data:
            # Training mode updates the statistics only; nothing is optimised.
            model(images / 255.0, training=True)
    for layer in norms:
        layer.momentum = 0.99
    backbone.save_weights(str(path))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=str(REPO / "benchmarks" / "data"))
    parser.add_argument("--out", default=None, help="runs folder (default ROOT/finetune-runs)")
    parser.add_argument("--model", default="mobilenet_025")
    parser.add_argument("--image-size", type=int, default=96)
    parser.add_argument("--pretrain-images", type=int, default=1200)
    parser.add_argument("--target-images", type=int, default=800)
    parser.add_argument("--pretrain-epochs", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the summary here")
    args = parser.parse_args()

    root = Path(args.root)
    out = Path(args.out) if args.out else root / "finetune-runs"
    pretrain = _pretrain_folder(root, args.pretrain_images, seed=100)
    target = _target_folder(root, args.target_images, seed=1)
    runs = [
        _train("pretrain", out, args, "--dataset", f"folder:{pretrain}",
               "--epochs", str(args.pretrain_epochs)),
    ]
    weights = str(_backbone_file(out / "pretrain", pretrain, args.image_size))
    runs += [
        _train("scratch", out, args, "--dataset", f"folder:{target}", "--epochs", str(args.epochs)),
        _train("finetune", out, args, "--dataset", f"folder:{target}", "--epochs", str(args.epochs),
               "--weights", weights),
        _train("finetune-2rep", out, args, "--dataset", f"folder:{target}",
               "--epochs", str(args.epochs), "--simulate-cpus", "2", "--weights", weights),
    ]
    for run in runs:
        print(f"{run['name']:14s} val_accuracy={run['val_accuracy']:.4f} "
              f"val_loss={run['val_loss']:.4f} epochs={run['epochs']} "
              f"replicas={run['replicas']} batch={run['global_batch']} "
              f"{run['images_per_second'] or 0:.0f} img/s {run['wall_time_seconds']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
