"""Under MultiWorkerMirroredStrategy every distributed dataset gets a batch dimension of None.

MULTI-WORKER ONLY: the script starts two worker processes on localhost itself (TF_CONFIG,
free ports), then computes the one-process MirroredStrategy reference.
What happens: experimental_distribute_dataset turns on partial-batch handling for every
finite dataset across workers, so even a dataset whose global batches are all full and
divide by the replicas (64 rows, batch(16, drop_remainder=True)) yields per-replica batches of shape (None, 3)
instead of (8, 3). Code that is right in one process then fails: ops.squeeze of a
(None, 1) batch of labels has unknown rank, and keras.io's supervised contrastive loss
raises "Cannot take the length of shape with unknown rank" on every worker.
Expected: a static batch size where every worker gets the same full batches (as a
one-process MirroredStrategy gives), or a documented way to keep it.
Background: tensorflow/tensorflow#41812 (partial batches under MWMS).
Versions tested: see README.md in this folder.
mirrorkit's fix (static-batch-shapes): for a dataset sharded by data whose static batches
divide by the replicas, turn the partial-batch handling off.
"""
import json, os, socket, subprocess, sys  # noqa: E401


def element_shapes(strategy, tf):
    ds = tf.data.Dataset.from_tensor_slices(tf.zeros((64, 3))).batch(16, drop_remainder=True)
    spec = strategy.experimental_distribute_dataset(ds).element_spec
    squeezed = tf.function(lambda d: strategy.run(lambda t: tf.squeeze(t[:, :1]), args=(d,)))
    out = squeezed.get_concrete_function(spec).structured_outputs
    return str(getattr(spec, "_component_specs", [spec])[0].shape), str(getattr(out, "values", [out])[0].shape)


if len(sys.argv) > 1:  # a worker
    import tensorflow as tf
    print("WORKER", *element_shapes(tf.distribute.MultiWorkerMirroredStrategy(), tf), sep="|", flush=True)
    sys.exit(0)
ports = []
for _ in range(2):
    with socket.socket() as s:
        s.bind(("localhost", 0))
        ports.append(s.getsockname()[1])
procs = [subprocess.Popen([sys.executable, __file__, str(i)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True, env={**os.environ, "TF_CONFIG": json.dumps({
                              "cluster": {"worker": [f"localhost:{p}" for p in ports]},
                              "task": {"type": "worker", "index": i}})}) for i in range(2)]
lines = [p.communicate(timeout=180)[0].strip().splitlines()[-1:] for p in procs]
import numpy as np  # noqa: E402,F401
import tensorflow as tf  # noqa: E402
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
one = element_shapes(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]), tf)
print("MirroredStrategy, 1 process, 2 replicas : per-replica batch", one[0], "squeezed labels", one[1])
for i, line in enumerate(lines):
    print(f"MultiWorkerMirroredStrategy worker {i}   :", line)
worker = lines[0][0].split("|")[1:] if lines[0] else None
if worker and worker[0] != one[0]:
    print(f"BUG REPRODUCED: per-replica batch {worker[0]} across 2 workers vs {one[0]} in one process; "
          f"squeezed labels {worker[1]} vs {one[1]}")
    sys.exit(1)
print("NOT REPRODUCED" if worker else "NOT REPRODUCED (workers gave no result)")
