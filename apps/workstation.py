"""A workstation run of ``mirrorkit train``'s defaults, through the library.

The same job as ``mirrorkit train`` with no options: the small CNN on the
embedded digits, 32 images per replica on every local device (all GPUs; on a
CPU-only machine one device, or N with ``MIRRORKIT_SIMULATE_CPUS=N``), written
to a new ``runs/<time>-cnn-digits`` folder. About 15-30 s on 2 CPU cores,
validation accuracy about 0.98.

    python apps/workstation.py
    MIRRORKIT_SIMULATE_CPUS=2 python apps/workstation.py
    python apps/workstation.py --epochs 3 --output runs/quick

Copy it and change the :class:`~mirrorkit.training.TrainConfig` fields
(``model=``, ``dataset=``, ``data=DataOptions(...)``) for your own job.
"""

import argparse

from mirrorkit.training import DEFAULT_EPOCHS, TrainConfig, train


def main(argv: list[str] | None = None) -> float:
    """Train with the defaults (optionally fewer epochs / another output); return val accuracy.

    Example:
        >>> main(["--epochs", "3", "--output", "runs/quick"])   # doctest: +SKIP
        0.97...
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS)
    parser.add_argument("--output", default=None, help="default: a new runs/ folder")
    args = parser.parse_args(argv)
    result = train(TrainConfig(epochs=args.epochs, output=args.output), echo=print)
    print(f"{result.runtime.replicas} replica(s), {result.images_per_second or 0:,.0f} images/s, "
          f"val_accuracy {result.val_accuracy:.3f}, model in {result.output_dir / 'model.keras'}")
    return result.val_accuracy


if __name__ == "__main__":
    main()
