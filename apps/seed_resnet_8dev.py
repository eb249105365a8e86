"""The seed scenario: ResNet-20, 32 images per replica, a global batch of 256 on 8 devices.

On a machine with 8 GPUs this trains on the 8 GPUs; without GPUs the CPU is
split into 8 logical devices (``simulate_cpus=8``), so the same 8-replica
MirroredStrategy code path runs for real. Data: small synthetic 32x32 RGB
images (3 epochs of 3 steps); 1-4 minutes on 2 CPU cores, depending on load.

    python apps/seed_resnet_8dev.py

The same as one command:

    mirrorkit train --simulate-cpus 8 --model resnet20 --dataset synthetic \\
        --image-size 32 --examples 768 --per-replica-batch 32 --epochs 3 \\
        --optimizer momentum --warmup-epochs 1

It checks what the scenario promises: 8 replicas, 32 per replica, 256 global,
and a learning rate scaled linearly from batch 32 to 256. The accuracy after 9
steps on random images means nothing (BatchNormalization's moving statistics
are barely warmed up); the run exercises the mechanics. Most of its time is
tracing the 8-replica training step once.
"""

import sys

from mirrorkit.datasets import DataOptions
from mirrorkit.training import TrainConfig, train

REPLICAS = 8
PER_REPLICA = 32


def main(argv: list[str] | None = None) -> int:
    """Run the scenario; ``--output DIR`` to choose where it writes (default: runs/...),
    ``--epochs N`` how long (default 3).

    Example:
        >>> main(["--output", "runs/seed"])        # doctest: +SKIP
        0
    """
    argv = sys.argv[1:] if argv is None else argv
    output = argv[argv.index("--output") + 1] if "--output" in argv else None
    epochs = int(argv[argv.index("--epochs") + 1]) if "--epochs" in argv else 3
    config = TrainConfig(
        model="resnet20",
        dataset="synthetic",
        # 3 steps of 256 per epoch: enough to exercise the 8-replica step.
        data=DataOptions(image_size=32, channels=3, classes=10,
                         examples=3 * REPLICAS * PER_REPLICA),
        per_replica_batch=PER_REPLICA,
        epochs=epochs,
        optimizer="momentum",
        warmup_epochs=1,
        # Only used on a CPU-only machine: GPUs, when present, take precedence.
        simulate_cpus=REPLICAS,
        output=output,
    )
    result = train(config, echo=print)
    m = result.metrics
    ok = (m["replicas"] == REPLICAS and m["per_replica_batch"] == PER_REPLICA
          and m["global_batch"] == REPLICAS * PER_REPLICA)
    print(f"seed scenario: {m['replicas']} replicas x {m['per_replica_batch']} = "
          f"{m['global_batch']} global, lr {m['base_learning_rate']:g} -> {m['learning_rate']:g}, "
          f"{m['images_per_second']:,.0f} images/s -> {'OK' if ok else 'NOT the seed scenario'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
