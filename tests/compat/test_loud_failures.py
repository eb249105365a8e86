"""A fix whose own code fails never hands the step back to Keras silently.

Falling back to Keras's behaviour when mirrorkit's reading of a step breaks
means N times (or 1/N of) one device's gradient with nothing said. Here each
fix that reads a user's step is made to fail from inside, on 2 real
replicas, and the step must stop with :class:`FixFailed` naming that fix and
``MIRRORKIT_COMPAT_DISABLE``. A second test reads the source: a broad
``except`` in :mod:`mirrorkit.compat` that does not re-raise must be one of
the few listed below, each about upstream code's behaviour, not ours.
"""

from __future__ import annotations

import ast

from conftest import REPO, run_snippet

STEPS = """
import json
import numpy as np, keras, tensorflow as tf
from keras import ops
import mirrorkit
from mirrorkit import compat
from mirrorkit.compat import loss_parts, mean_gradients, paired_losses, replica_copies
from mirrorkit.compat.failures import FixFailed

strategy = mirrorkit.get_strategy(simulate_cpus=2)
x = np.arange(32, dtype="float32").reshape(16, 2) / 32
y = np.ones((16, 1), "float32")


class HandLoss(keras.Model):
    # keras.io's custom train_step: a hand-averaged loss, logged through a Mean.
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1, kernel_initializer="zeros")
        self.tracker = keras.metrics.Mean(name="loss")
        self.queue = keras.Variable(ops.zeros((4, 1)), trainable=False, aggregation="none")

    def call(self, inputs):
        return self.dense(inputs)

    def train_step(self, data):
        inputs, targets = data
        with tf.GradientTape() as tape:
            loss = ops.mean(ops.square(targets - self(inputs)))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        self.queue.assign(self(inputs))
        self.tracker.update_state(loss)
        return {"loss": self.tracker.result()}


def boom(*args, **kwargs):
    raise KeyError("a defect inside mirrorkit")


def fit_fails_naming():
    with strategy.scope():
        model = HandLoss()
        model.compile("sgd")
    try:
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    except FixFailed as err:
        return [err.fix, "MIRRORKIT_COMPAT_DISABLE=" + err.fix in str(err),
                "a defect inside mirrorkit" in str(err)]
    return None


out = {}
for name, module, attr, disable in [
        ("hand-mean-gradients", mean_gradients, "plan", []),
        ("logged-step-losses", loss_parts, "reader", ["hand-mean-gradients"]),
        ("paired-step-losses", paired_losses, "_check", []),
        ("replica-variable-copies", replica_copies, "_check", [])]:
    compat.apply(disable=disable)
    kept = getattr(module, attr)
    setattr(module, attr, boom)
    try:
        out[name] = fit_fails_naming()
    finally:
        setattr(module, attr, kept)
compat.apply(disable=[])
with strategy.scope():
    model = HandLoss()
    model.compile("sgd")
out["healthy"] = model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False).history
print("RESULT " + json.dumps(out))
"""


def test_a_fix_that_fails_inside_a_step_stops_it_naming_the_fix(tmp_path):
    result, _ = run_snippet(STEPS, tmp_path)
    for name in ("hand-mean-gradients", "logged-step-losses", "paired-step-losses",
                 "replica-variable-copies"):
        assert result[name] == [name, True, True], (
            f"{name}: a failure inside the fix must stop the step naming it, not fall back "
            f"to Keras's behaviour; got {result[name]}")
    assert len(result["healthy"]["loss"]) == 1


# A broad except that does not re-raise, each about how *upstream* code behaves:
# (module, function) -> why falling back there changes no number silently.
ALLOWED = {
    ("allocator.py", "_runtime_started"): "a TensorFlow without this internal: assume not "
                                          "(a speed fix)",
    ("allocator.py", "restore"): "a speed fix that cannot apply warns and leaves speed as is",
    ("empty_conv.py", "_kernel_is_broken"): "probe failure: guard the convolutions anyway",
    ("probe_report.py", "_run"): "a probe reports, it never raises: None is 'cannot tell'",
    ("fix.py", "decide"): "a probe that breaks decides nothing: the fix is applied in doubt",
    ("no_call_build.py", "_symbolic_build"): "Keras's own build failed: left to the step, "
                                             "as without a strategy",
    ("saving_cache.py", "share_saving_references"): "a type this Keras does not know has no "
                                                    "skip set",
    ("static_batches.py", "reads_files"): "an input that cannot be walked counts as reading "
                                          "files: the safe answer",
    ("symbolic_order.py", "_spec_batch"): "an adapter with no dataset: Keras's own peek",
}


def _own_nodes(func: ast.AST):
    """The nodes of ``func``'s body, not of the functions defined inside it."""
    todo = list(ast.iter_child_nodes(func))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def _broad_handlers_without_raise() -> set[tuple[str, str]]:
    found = set()
    for path in sorted((REPO / "mirrorkit" / "compat").glob("*.py")):
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in _own_nodes(func):
                if not isinstance(node, ast.ExceptHandler):
                    continue
                names = [node.type] if not isinstance(node.type, ast.Tuple) else node.type.elts
                broad = node.type is None or any(
                    getattr(n, "id", None) in ("Exception", "BaseException") for n in names)
                if broad and not any(isinstance(n, ast.Raise) for n in ast.walk(node)):
                    found.add((path.name, func.name))
    return found


def test_no_fix_swallows_an_exception_outside_the_listed_upstream_cases():
    # Probes (probes*.py) report True/False/None and never raise by contract: a probe
    # that breaks decides nothing, and the fix is then applied in doubt (fix.decide).
    found = {spot for spot in _broad_handlers_without_raise()
             if not spot[0].startswith("probes")}
    unexpected = found - set(ALLOWED)
    assert not unexpected, (
        f"{sorted(unexpected)} catch every exception and carry on: a failure there would "
        "silently give Keras's behaviour back (N x or 1/N of a gradient). Raise FixFailed "
        "(mirrorkit.compat.failures.failing_loudly), or add it to ALLOWED with why falling "
        "back changes no number")
    assert set(ALLOWED) - found == set(), "ALLOWED lists a spot that no longer swallows"
