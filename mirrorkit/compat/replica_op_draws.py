"""TensorFlow's own random ops in a replica's step: each replica's rows of one device's draw.

Part of the ``replica-random`` fix (:mod:`mirrorkit.compat.replica_random`
covers ``keras.random`` and Keras's layers). A train step that draws with
``tf.random.normal(shape=(batch_size, latent_dim))`` (keras.io's WGAN-GP,
TensorFlow's DCGAN tutorial) creates one stateful random op per replica,
seeded from the graph (``tf.random.set_seed`` and the op's place in it):
across workers every worker's op has the same seeds, so every worker draws
the same numbers for its own rows (measured under ``mirrorkit launch -n 2``:
both workers' rows of a (4, 2) draw equal plain Python's first two rows);
on one worker the second replica's op gets other seeds than the first's, so
its rows are random but not plain Python's.

The fix gives each replica's k-th unseeded draw of a step the op seed one
device's k-th draw gets (:func:`make_get_seed` numbers them), so every
replica's op has one device's seeds, and wraps the ops' generated functions
(``random_standard_normal``, ``random_uniform``, ``truncated_normal``, which
``tf.random.normal``, ``uniform``, ``truncated_normal`` and ``tf.nn.dropout``
call): a batch-shaped draw in a replica's step draws the global batch's
shape and keeps this replica's rows. Other draws (not batch-shaped: one
device makes one, which the replicas now share) keep their shape; outside a
step, or with no seed set (plain Python is not repeatable then either),
nothing changes.

Example:
    >>> from tensorflow.python.ops import gen_random_ops         # doctest: +SKIP
    >>> patched = make(gen_random_ops.random_standard_normal)   # doctest: +SKIP
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

from mirrorkit.compat import step_rows
from mirrorkit.compat.replica_random import rows_of_global, shape_list, with_static_shape

# Per graph: its seed counter's value at the step's first draw, and how many
# draws each replica thread has made in it.
_BASE: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
_MADE: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
# This thread's last unseeded draw: (the seeds TensorFlow gave, one device's).
_local = threading.local()


def make_get_seed(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Wrap ``random_seed.get_seed``: note one device's seed for a replica's k-th unseeded draw.

    With a global seed and no op seed, TensorFlow numbers a graph's random
    ops in creation order. One device's step makes its draws 0, 1, 2 ...;
    replicas tracing into one graph take turns and interleave the numbers.
    Each replica thread counts its own draws from the number the step's
    first draw got, as one device does; the op functions :func:`make` wraps
    use that number (other random ops, ``shuffle`` or ``categorical``, keep
    TensorFlow's).

    Example:
        >>> from tensorflow.python.framework import random_seed      # doctest: +SKIP
        >>> patched = make_get_seed(random_seed.get_seed)            # doctest: +SKIP
    """

    def get_seed(op_seed: Any) -> Any:
        seeds = original(op_seed)
        _local.pending = None
        if op_seed is not None or seeds[0] is None:
            return seeds
        import tensorflow as tf
        from tensorflow.python.framework import ops

        rows = step_rows.current()
        graph = ops.get_default_graph()
        if rows is None or tf.executing_eagerly() or not step_rows.inside(rows.graph):
            return seeds
        base = _BASE.setdefault(graph, seeds[1])
        made = _MADE.setdefault(graph, {})
        thread = threading.get_ident()
        made[thread] = made.get(thread, 0) + 1
        _local.pending = (tuple(seeds), (seeds[0], base + made[thread] - 1))
        return seeds

    return get_seed


def _one_device_seeds(seed: int, seed2: int) -> tuple[int, int]:
    """The seeds one device's op gets for the draw ``get_seed`` just numbered, else these."""
    pending, _local.pending = getattr(_local, "pending", None), None
    return pending[1] if pending is not None and pending[0] == (seed, seed2) else (seed, seed2)


def make(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a stateful shape-first random op's generated function with the fix.

    Example:
        >>> from tensorflow.python.ops import gen_random_ops         # doctest: +SKIP
        >>> patched = make(gen_random_ops.random_uniform)           # doctest: +SKIP
    """

    def draw(shape: Any, dtype: Any, seed: int = 0, seed2: int = 0, name: Any = None) -> Any:
        rows = step_rows.current()
        if rows is None or rows.graph is None or not (seed or seed2):
            return original(shape, dtype, seed=seed, seed2=seed2, name=name)
        seed, seed2 = _one_device_seeds(seed, seed2)
        dims = shape_list(shape)
        if dims is None or not step_rows.inside(rows.graph):
            return original(shape, dtype, seed=seed, seed2=seed2, name=name)

        def upstream(dims_: list[Any]) -> Any:
            import tensorflow as tf

            return original(tf.stack(dims_), dtype, seed=seed, seed2=seed2, name=name)

        out = rows_of_global(dims, upstream)
        if out is None:
            return original(shape, dtype, seed=seed, seed2=seed2, name=name)
        return with_static_shape(out, dims)

    return draw
