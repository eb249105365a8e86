"""Realistic input: a JPEG folder and JPEG TFRecord shards, timed by `mirrorkit bench --input-only`.

Writes (once) a photo-like folder with tools/make_jpeg_folder.py and the same
JPEG bytes as TFRecord shards (``mirrorkit export`` writes resized PNGs, so
the original JPEGs are packed here, in its schema), then runs
``mirrorkit bench --input-only`` for each case and prints one summary line per
case from its ``input_bench.json``. Run it at a quiet moment; images per
CPU-second are the figures that survive neighbours on shared cores.

Example:
    python benchmarks/jpeg_input.py --root benchmarks/data --images 3000 --classes 4
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _folder(root: Path, images: int, classes: int) -> Path:
    folder = root / f"photos{images}"
    if not folder.is_dir():
        subprocess.run([sys.executable, str(REPO / "tools" / "make_jpeg_folder.py"), str(folder),
                        "--images", str(images), "--classes", str(classes)], check=True)
    return folder


def _shards(folder: Path, shards: int = 8) -> Path:
    """The folder's JPEG bytes as files: shards (80/20 split by index, round-robin files)."""
    out = folder.with_name(folder.name + "-tfrecord")
    if out.is_dir():
        return out
    import tensorflow as tf

    out.mkdir(parents=True)
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    files = sorted(folder.rglob("*.jpg"))
    for split, part in (("train", [f for i, f in enumerate(files) if i % 5]),
                        ("val", [f for i, f in enumerate(files) if not i % 5])):
        writers = [tf.io.TFRecordWriter(str(out / f"{split}-{k:05d}-of-{shards:05d}.tfrecord"))
                   for k in range(shards)]
        for i, path in enumerate(part):
            feature = {
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[path.read_bytes()])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(
                    value=[classes.index(path.parent.name)])),
            }
            writers[i % shards].write(tf.train.Example(
                features=tf.train.Features(feature=feature)).SerializeToString())
        for writer in writers:
            writer.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(REPO / "benchmarks" / "data"))
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--output", default="bench-out/jpeg_input")
    parser.add_argument("--cases", default="folder-crop,folder-none,files-crop",
                        help="comma-separated subset of the cases")
    args = parser.parse_args()
    folder = _folder(Path(args.root), args.images, args.classes)
    cases = [("folder-crop", f"folder:{folder}", "crop"),
             ("folder-none", f"folder:{folder}", "none"),
             ("files-crop", f"files:{_shards(folder)}" if "files-crop" in args.cases else "", "crop")]
    for name, dataset, augment in cases:
        if name not in args.cases.split(","):
            continue
        out = Path(args.output) / name
        subprocess.run([sys.executable, "-m", "mirrorkit", "bench", "--input-only",
                        "--dataset", dataset, "--image-size", "224", "--batch", "64",
                        "--augment", augment, "--steps", str(args.batches),
                        "--rounds", str(args.rounds), "--output", str(out)], check=True)
        report = json.loads((out / "input_bench.json").read_text())
        rates = ", ".join(f"{arm} {row['images_per_cpu_sec']:.0f}"
                          for arm, row in report["arms"].items())
        ratios = report["ratios"]
        whole = ratios.get("pipeline_to_whole_per_cpu_second")
        print(f"{name}: images/CPU-s {rates}; pipeline/plain "
              f"{ratios['pipeline_to_plain_per_cpu_second']:.2f}, pipeline/decode "
              f"{ratios['pipeline_to_decode_per_cpu_second']:.2f}"
              + (f", pipeline/whole-file decode {whole:.2f}" if whole else ""), flush=True)


if __name__ == "__main__":
    main()
